"""Who scans the join for missing ranks: only rank 0 follows the arrivals; the others read the one key it
publishes, yet every rank still names the missing rank in its progress record and its final error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from init_launch import Launcher

COUNTER = Path(__file__).with_name("_scan_counter.py")
#: Attempts of 6 s within a 16 s deadline: the progress record (after 10 s) comes in the second attempt.
KWARGS = {"deadline": 16, "attempt_timeout": 6, "backoff": {"initial": 0.5, "jitter": 0.1}}


@pytest.mark.timeout(120)
def test_only_rank_0_scans_and_every_rank_names_the_missing_rank(launcher: Launcher, port: int) -> None:
    """World 4, rank 3 never comes: ranks 1 and 2 read no arrival order and no other rank's claim."""
    ranks = [launcher.start(r, 4, port, kwargs=KWARGS, prefix=[sys.executable, str(COUNTER)]) for r in range(3)]
    results = [h.result(90) for h in ranks]
    reads = [json.loads(Path(str(h.out) + ".reads").read_text()) for h in ranks]
    for rank, (res, seen) in enumerate(zip(results, reads, strict=True)):
        assert res["error"] == "RendezvousTimeoutError", res
        assert res["ranks"] == [3], res["message"]
        assert "missing ranks [3]" in res["message"]
        progress = [line for line in res["log"].splitlines() if "waiting for ranks [3] to join" in line]
        assert progress, (rank, res["log"][-3000:])
        if rank == 0:
            assert seen.get("order/1", 0) >= 1, seen  # rank 0 follows the arrivals
        else:
            assert not any(key.startswith("order/") for key in seen), (rank, seen)
            others = {key for key in seen if key.startswith("claim/")} - {"claim/0", f"claim/{rank}"}
            assert not others, (rank, seen)  # no per-rank claim scan
            assert seen.get("missing", 0) >= 2, (rank, seen)  # the progress record and the final error
