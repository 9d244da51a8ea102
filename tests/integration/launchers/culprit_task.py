"""One task of the after-setup culprit test: ``culprit_task.py VICTIM``.

setup() (the launcher's variables), one barrier, then rank VICTIM prints its pid and SIGKILLs itself while
the others all_reduce until the collective fails (at most 120 s); distinit names who stopped first at exit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import distinit


def main() -> None:
    victim = int(sys.argv[1])
    rank = distinit.setup("gloo", deadline=120).env.rank
    print(json.dumps({"rank": rank, "pid": os.getpid()}), flush=True)
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    tensor, end = torch.ones(1), time.monotonic() + 120
    while time.monotonic() < end:
        dist.all_reduce(tensor)
    raise SystemExit("no collective failed within 120 s")


if __name__ == "__main__":
    main()
