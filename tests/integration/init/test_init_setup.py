"""setup()/teardown() in real processes, and the structured attempt records."""

from __future__ import annotations

import pytest
from init_launch import Launcher


@pytest.mark.timeout(90)
def test_setup_is_idempotent_and_teardown_allows_a_fresh_setup(launcher: Launcher, port: int) -> None:
    kwargs = {"deadline": 30, "attempt_timeout": 10}
    handles = [launcher.start(r, 2, port, kwargs=kwargs, mode="setup") for r in (0, 1)]
    for rank, res in enumerate(h.result(80) for h in handles):
        assert res["ok"], res
        assert res["same"] is True
        assert res["already"] is True
        assert res["incompatible"] == "RendezvousError"
        assert res["torn_down"] is True
        assert res["reformed"] is True
        assert res["device"] == "cpu"
        assert res["exported_rank"] == str(rank)


@pytest.mark.timeout(60)
def test_one_structured_record_per_failed_attempt(launcher: Launcher, port: int) -> None:
    kwargs = {"deadline": 20, "attempt_timeout": 1.5, "backoff": {"initial": 0.3, "jitter": 0.1}}
    master = launcher.start(0, 2, port, kwargs=kwargs)
    worker = launcher.start(1, 2, port, kwargs=kwargs, start_after=4)
    res0, res1 = master.result(50), worker.result(50)
    assert res0["ok"] and res1["ok"], (res0, res1)
    failed = [e for e in res0["events"] if e["event"] == "init.attempt_failed"]
    retried = [a for a in res0["report"]["attempts"] if a["retried"]]
    assert len(failed) == len(retried) >= 1  # exactly one record per failed attempt
    for number, event in enumerate(failed, start=1):
        assert event["rank"] == 0 and event["attempt"] == number
        assert event["phase"] == "join" and event["missing_ranks"] == [1]
        assert event["pause_s"] >= 0 and event["left_s"] > 0
    done = [e for e in res0["events"] if e["event"] == "init.done"]
    assert len(done) == 1 and done[0]["attempts"] == len(res0["report"]["attempts"])


@pytest.mark.timeout(60)
def test_the_last_failed_attempt_is_recorded_too(launcher: Launcher, port: int) -> None:
    kwargs = {"deadline": 4, "attempt_timeout": 1.5, "backoff": {"initial": 0.3, "jitter": 0.1}}
    res = launcher.start(0, 2, port, kwargs=kwargs).result(40)
    assert res["error"] == "RendezvousTimeoutError"
    failed = [e for e in res["events"] if e["event"] == "init.attempt_failed"]
    assert [e["attempt"] for e in failed] == list(range(1, len(failed) + 1))
    assert failed[-1]["pause_s"] is None and all(e["pause_s"] is not None for e in failed[:-1])
    assert len(failed) == res["message"].count("#")  # the error lists the same attempts
