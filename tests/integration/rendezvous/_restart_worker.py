"""A torchrun worker for the restart tests: a plain gloo group from torchrun's variables, one all_reduce, a fault.

DISTINIT_TEST_FAIL: ``once`` (raise on the first attempt, TORCHELASTIC_RESTART_COUNT=0) or ``always``.
DISTINIT_TEST_FAIL_RANKS: the ranks that raise (comma-separated; ``0@3``: rank 0 raises 3 s after its all_reduce);
the others stay healthy: they wait, without a collective, for DISTINIT_TEST_RELEASE (a file) or 120 s, so their
agent sees the failed node re-join first.
Every worker prints ``worker rank=R world=W sum=S restart=C`` after its all_reduce. ``@record`` writes torch's
error file, so the agent knows the error's first line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def _failing(spec: str) -> dict[str, float]:
    """``"1,0@3"`` -> ``{"1": 0.0, "0": 3.0}``: rank -> seconds after its all_reduce before it raises."""
    found = {}
    for item in filter(None, spec.split(",")):
        rank, _, after = item.partition("@")
        found[rank] = float(after or 0)
    return found


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    print(f"worker rank={rank} world={dist.get_world_size()} sum={tensor.item():g} restart={restart}", flush=True)
    failing = _failing(os.environ.get("DISTINIT_TEST_FAIL_RANKS", ""))
    mode = os.environ.get("DISTINIT_TEST_FAIL", "once")
    if str(rank) in failing and (mode == "always" or restart == "0"):
        time.sleep(float(failing[str(rank)]))  # the race: this rank fails while its agent sees a peer re-join
        raise RuntimeError(f"deliberate failure of rank {rank} at restart {restart}")
    if restart == "0" or mode == "always":
        release = Path(os.environ.get("DISTINIT_TEST_RELEASE", "/nonexistent"))
        end = time.monotonic() + 120
        while not release.exists() and time.monotonic() < end:
            time.sleep(0.1)  # polls a file; the agent stops this worker when its peer's failure restarts the round
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
