"""Run by torchrun in the restart test: on attempt 0, rank 1 hangs inside its region; attempt 1 completes."""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

from distinit.watchdog import WatchdogClient, configure, expires

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out_dir = sys.argv[1]
configure(WatchdogClient(fail_closed=True))
# A fresh key prefix per attempt: without it, torch 2.13's restarted gloo group sometimes fails in
# connectFullMesh ("Connection refused") or hangs. Seen in 1 of 3 plain torchrun runs with no watchdog at all.
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
dist.init_process_group(
    "gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank, world_size=int(os.environ["WORLD_SIZE"])
)
with open(os.path.join(out_dir, f"pid-{attempt}-{rank}"), "w") as fh:
    fh.write(str(os.getpid()))
# Rank 1's region is short; rank 0 waits in the barrier under a long one, so only rank 1 can expire.
with expires(after=1.5 if rank == 1 else 120, scope=f"step-attempt{attempt}"):
    if rank == 1 and attempt == 0:
        time.sleep(600)  # the hang
    dist.barrier()
with open(os.path.join(out_dir, f"done-{attempt}-{rank}"), "w") as fh:
    fh.write("ok")
dist.destroy_process_group()
