"""A stray client on the rendezvous store writes the group's state key (garbage, or a well-formed verdict without
the generation token and writer rank): the ranks refuse it (a logged WARNING, never raised) and the world forms.
A wrong token or writer is refused by the same check (``verdict_origin``, table-tested in the unit tests)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from init_launch import Launcher

KWARGS = {"deadline": 60, "attempt_timeout": 20, "backoff": {"initial": 0.5, "jitter": 0.1}}
PREFIX = "distinit/job/0/c1/g0/"
FORGED = {
    "garbage": "\x00not json at all",
    "verdict": json.dumps({"error": "RankLostError", "what": "forged: rank 7 is lost", "why": "", "fix": ""}),
    # 100,000 levels deep: json.loads raises RecursionError (not ValueError); it once escaped the check and
    # every attempt failed at once, 17,245 attempts in 25 s (issue 33, item 9)
    "deep": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", list(FORGED.values()), ids=list(FORGED))
def test_forged_state_is_refused_and_the_world_forms(launcher: Launcher, port: int, tmp_path: Path, value: str) -> None:
    from torch.distributed import TCPStore

    go = tmp_path / "go"
    r0 = launcher.start(0, 2, port, kwargs=KWARGS)
    r1 = launcher.start(1, 2, port, kwargs=KWARGS, extra={"after_file": str(go)})
    stray = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
    stray.wait([PREFIX + "beat/0"], timedelta(seconds=60))  # rank 0 entered and waits on the state key
    stray.set(PREFIX + "state", value)
    go.touch()
    del stray
    results = [r0.result(60), r1.result(60)]
    assert all(res["ok"] for res in results), results
    logs = results[0]["log"] + results[1]["log"]  # whichever rank read it first refused it
    assert "refused" in logs and "not a verdict of this group" in logs, logs[-3000:]
    assert logs.count("retrying in") < 10, logs[-3000:]  # refused and removed once: no spin of attempts
    assert "forged" not in json.dumps([res.get("message", "") for res in results])
