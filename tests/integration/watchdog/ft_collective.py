"""A worker for the culprit tests of each route: `python ft_collective.py CLIENT HUNG AFTER [WAITER_AFTER]`.

CLIENT is ``torch`` (an unchanged ``torch.distributed.elastic.timer`` client on ``$TORCHELASTIC_TIMER_FILE``),
``distinit`` (the drop-in, ``distinit.watchdog.elastic``, on the same FIFO) or ``native`` (``WatchdogClient``
on ``$DISTINIT_WATCHDOG``). Every rank joins a gloo group (torchrun's, or without torchrun a FileStore at
``$FT_STORE`` with RANK and WORLD_SIZE from the environment), all-reduces once (in step), then enters
``expires(after=AFTER, scope="step")``: RANK HUNG hangs there in its own code (a sleep), the others wait for it
in an ``all_reduce``. With WAITER_AFTER, the waiting ranks arm that longer timeout instead (they do not expire
with the hung rank). Each rank prints one JSON line once armed: rank, pid, and its deadline in epoch seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

kind, hung, after = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
waiter_after = float(sys.argv[4]) if len(sys.argv) > 4 else after
rank = int(os.environ["RANK"])
mine = after if rank == hung else waiter_after
if kind == "native":
    from distinit.watchdog import WatchdogClient

    client = WatchdogClient(fail_closed=True)

    def region() -> contextlib.AbstractContextManager[Any]:
        return client.expires(mine, scope="step")
else:
    if kind == "torch":
        import torch.distributed.elastic.timer as timer
    else:
        import distinit.watchdog.elastic as timer  # type: ignore[no-redef]
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))

    def region() -> contextlib.AbstractContextManager[Any]:
        return timer.expires(after=mine, scope="step")


torch.set_num_threads(1)
if "FT_STORE" in os.environ:  # no torchrun
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=dist.FileStore(os.environ["FT_STORE"], world), rank=rank, world_size=world)
else:
    dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))  # every rank is in step when the guarded region starts
before = time.time()  # the deadline printed is at or before the one armed
with region():
    sys.stdout.write(json.dumps({"rank": rank, "pid": os.getpid(), "deadline": before + mine}) + "\n")
    sys.stdout.flush()
    if rank == hung:
        time.sleep(600)  # hang:ft-collective-culprit (its own code)
    dist.all_reduce(torch.ones(4))  # hang:ft-collective-victim (waits for the hung rank)
dist.destroy_process_group()
