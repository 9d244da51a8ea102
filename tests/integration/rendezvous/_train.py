"""A torchrun worker for the rendezvous tests: distinit.setup(), one all_reduce, and optional faults.

DISTINIT_TEST_MARKS: a folder; each worker writes ``<rank>-<restart>`` there once its group formed.
DISTINIT_TEST_FAIL_ONCE: a rank (or ``all``) that exits 3 before its all_reduce on the first attempt (restart 0).
DISTINIT_TEST_HOLD: keep all-reducing until this file exists (at most 60 s): a peer's death fails the worker.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distinit

distinit.setup("gloo", deadline=60)
rank = dist.get_rank()
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
marks = os.environ.get("DISTINIT_TEST_MARKS")
if marks:
    Path(marks, f"{rank}-{restart}").write_text(f"{os.getpid()} {dist.get_world_size()}\n")
if os.environ.get("DISTINIT_TEST_FAIL_ONCE") in (str(rank), "all") and restart == "0":
    sys.exit(3)  # this agent sees its worker fail and restarts (so does every agent with "all")
tensor = torch.ones(1)
dist.all_reduce(tensor)
print(f"worker rank={rank} world={dist.get_world_size()} sum={tensor.item():g} restart={restart}", flush=True)
hold = os.environ.get("DISTINIT_TEST_HOLD")
if hold:
    end = time.monotonic() + 60
    while not Path(hold).exists() and time.monotonic() < end:
        dist.all_reduce(tensor)
        time.sleep(0.2)
