"""A rank that calls setup(), says it is ready, waits for the test's go, then all_reduces until something fails.

argv: a JSON spec (``dir``: the test's tmp dir; ``hold``: "spin" to hold the GIL in a thread after setup;
``mode``: "finish" for a normal end, rank 0 working ``work`` s longer than the others).
Uncaught errors end the process as a user's script would (traceback, atexit teardown).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distinit


def main() -> None:
    spec = json.loads(sys.argv[1])
    where = Path(spec["dir"])
    result = distinit.setup("gloo", deadline=60, attempt_timeout=30)
    rank = result.env.rank
    (where / f"ready{rank}").write_text(str(os.getpid()))
    if spec.get("mode") == "finish":
        # A normal end: every rank but 0 tears down and exits; rank 0 keeps working past the loss bound
        # (a final checkpoint), then tears down. Nobody was lost: no "stopped" warning may appear.
        if rank != 0:
            distinit.teardown()
            return
        time.sleep(float(spec["work"]))
        distinit.teardown()
        return
    end = time.monotonic() + 180
    while not (where / "go").exists():
        if time.monotonic() > end:
            raise SystemExit("no go from the test within 180 s")
        time.sleep(0.02)
    tensor = torch.ones(1)
    while time.monotonic() < end:
        dist.all_reduce(tensor)
    raise SystemExit("no collective failed within 180 s")


if __name__ == "__main__":
    main()
