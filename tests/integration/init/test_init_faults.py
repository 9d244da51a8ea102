"""Fault tests for init_with_retry: misconfiguration verdicts, missing/crashing ranks, foreign listeners,
in-process retries. Real processes, real TCPStore and gloo, loopback only."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from init_launch import Launcher, Rank, free_port

SHORT = {"deadline": 15, "attempt_timeout": 5, "backoff": {"initial": 0.5, "jitter": 0.2}}


def _wait_for_log(handle: Rank, text: str, timeout: float) -> None:
    """Synchronise on what a rank logged (polls its log file)."""
    end = time.monotonic() + timeout
    while text not in handle.log.read_text():
        if time.monotonic() > end or handle.proc.poll() is not None:
            raise AssertionError(f"{handle.name} did not log {text!r}:\n{handle.log.read_text()[-2000:]}")
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_duplicate_rank_every_rank_raises_the_same_verdict(launcher: Launcher, port: int) -> None:
    first = [launcher.start(0, 3, port, kwargs=SHORT), launcher.start(1, 3, port, kwargs=SHORT, name="rank1-a")]
    dup = launcher.start(1, 3, port, kwargs=SHORT, start_after=1.0, name="rank1-b")
    results = [h.result(40) for h in [*first, dup]]
    messages = {r["message"].splitlines()[0] for r in results}
    for res in results:
        assert not res["ok"], res
        assert res["error"] == "DuplicateRankError"
        assert res["ranks"] == [1]
        assert res["elapsed"] < 8, res["elapsed"]
    assert len(messages) == 1, messages  # the SAME verdict everywhere
    (message,) = messages
    assert "rank 1 was claimed twice" in message
    pids = {str(r["pid"]) for r in results[1:]}
    assert all(f"pid {pid}" in message for pid in pids), (message, pids)
    assert socket.gethostname() in message


@pytest.mark.timeout(60)
def test_duplicate_rank_zero_on_one_host(launcher: Launcher, port: int) -> None:
    a = launcher.start(0, 3, port, kwargs=SHORT, name="rank0-a")
    b = launcher.start(1, 3, port, kwargs=SHORT)
    dup = launcher.start(0, 3, port, kwargs=SHORT, start_after=1.5, name="rank0-b")
    results = [h.result(40) for h in (a, b, dup)]
    for res in results:
        assert res["error"] == "DuplicateRankError", res
        assert res["ranks"] == [0]
        assert res["elapsed"] < 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("size0", "size1"), [(3, 2), (2, 3)], ids=["rank0-says-3", "rank0-says-2"])
def test_world_size_mismatch_both_ways(launcher: Launcher, port: int, size0: int, size1: int) -> None:
    r0 = launcher.start(0, size0, port, kwargs=SHORT)
    r1 = launcher.start(1, size1, port, kwargs=SHORT, start_after=0.5)
    results = [r0.result(40), r1.result(40)]
    for res in results:
        assert res["error"] == "WorldSizeMismatchError", res
        assert res["elapsed"] < 8
        assert f"rank 1 says {size1}" in res["message"]
        assert f"rank 0 says {size0}" in res["message"]
    assert results[0]["message"] == results[1]["message"]


@pytest.mark.timeout(90)
def test_init_failure_retried_with_group_counter_reset_master_side(launcher: Launcher, port: int) -> None:
    """rank 1 joins, then dies inside init_process_group; rank 0's init fails, torch's group counter is
    reset (pytorch/pytorch#46561), the generation is bumped, and a restarted rank 1 completes the world."""
    kwargs = {"deadline": 40, "attempt_timeout": 4, "backoff": {"initial": 0.5, "jitter": 0.1}}
    master = launcher.start(0, 2, port, kwargs=kwargs)
    doomed = launcher.start(1, 2, port, kwargs=kwargs, mode="die_in_init", name="rank1-doomed")
    assert doomed.exit_code(30) == 3
    _wait_for_log(master, "failed in init", 30)  # restart only after rank 0's init attempt failed
    again = launcher.start(1, 2, port, kwargs=kwargs, name="rank1-again")
    res0, res1 = master.result(60), again.result(60)
    assert res0["ok"] and res1["ok"], (res0, res1)
    report = res0["report"]
    assert report["group_counter_reset"] >= 1
    assert report["generation"] >= 1
    assert any(a["error"] == "init" for a in report["attempts"])


@pytest.mark.timeout(90)
def test_init_failure_retried_with_group_counter_reset_worker_side(launcher: Launcher, port: int) -> None:
    kwargs = {"deadline": 40, "attempt_timeout": 4, "backoff": {"initial": 0.5, "jitter": 0.1}}
    worker = launcher.start(1, 2, port, kwargs=kwargs)
    doomed = launcher.start(0, 2, port, kwargs=kwargs, mode="die_in_init", name="rank0-doomed")
    assert doomed.exit_code(30) == 3
    again = launcher.start(0, 2, port, kwargs=kwargs, name="rank0-again")
    res0, res1 = again.result(60), worker.result(60)
    assert res0["ok"] and res1["ok"], (res0, res1)
    assert res1["report"]["group_counter_reset"] >= 1


@pytest.mark.timeout(90)
def test_rank_crashing_mid_join(launcher: Launcher, port: int, tmp_path: Path) -> None:
    """rank 1 claims its rank and crashes before the world is complete: its heartbeat stops, so the others
    name it within seconds (not at the deadline); a rank 1 restarted at once on the same host takes the
    dead claim over before it goes stale, and the world forms."""
    kwargs = {"deadline": 30, "attempt_timeout": 5, "backoff": {"initial": 0.5, "jitter": 0.1}}
    r0 = launcher.start(0, 3, port, kwargs=kwargs)
    crashing = launcher.start(1, 3, port, kwargs=kwargs, mode="die_in_join", name="rank1-crash")
    assert crashing.exit_code(30) == 4
    res0 = r0.result(30)
    assert res0["error"] == "RankLostError", res0
    assert res0["ranks"] == [1]
    assert res0["elapsed"] < 15, res0["elapsed"]

    port2 = free_port()
    go = tmp_path / "go"
    kwargs = {"deadline": 20, "attempt_timeout": 5, "backoff": {"initial": 0.5, "jitter": 0.1}}
    r0 = launcher.start(0, 3, port2, kwargs=kwargs, name="rank0-b")
    # Started (imports done) before the crash, released right after it: a launcher's prompt restart.
    restarted = launcher.start(1, 3, port2, kwargs=kwargs, name="rank1-restarted", extra={"after_file": str(go)})
    crashing = launcher.start(1, 3, port2, kwargs=kwargs, mode="die_in_join", name="rank1-crash-b")
    assert crashing.exit_code(30) == 4
    go.touch()
    r2 = launcher.start(2, 3, port2, kwargs=kwargs, name="rank2-b")
    results = [h.result(30) for h in (r0, restarted, r2)]
    assert all(res["ok"] for res in results), results
    # the restart took the dead claim over in place: the world formed in generation 0, no init failure
    assert all(res["report"]["generation"] == 0 for res in results)


@pytest.mark.timeout(60)
def test_frozen_master_mid_join_still_ends_at_the_deadline(launcher: Launcher, port: int) -> None:
    """A store host that stops answering (SIGSTOP: TCP stays up, nothing replies) must not stall a worker
    past its deadline: torch's store client has no receive timeout, so only distinit's own bound ends it."""
    import os
    import signal
    from datetime import timedelta

    from torch.distributed import TCPStore

    kwargs = {"deadline": 8, "attempt_timeout": 30}
    master = launcher.start(0, 3, port, kwargs=kwargs)
    worker = launcher.start(1, 3, port, kwargs=kwargs, call_again=True)
    # The probe connects once rank 0 runs its code: its interpreter's start (torch's import) took more than the
    # probe's 20 s on a loaded CI machine, and a client that gives up first is no part of what is tested here.
    assert master.wait_started() and worker.wait_started(), master.log.read_text()[-3000:]
    probe = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=20))
    probe.wait(["distinit/job/0/c1/g0/claim/1"], timedelta(seconds=20))  # rank 1 joined and waits for rank 2
    del probe
    os.kill(master.proc.pid, signal.SIGSTOP)
    try:
        res = worker.result(30)
    finally:
        os.kill(master.proc.pid, signal.SIGCONT)
    assert res["error"] == "RendezvousTimeoutError", res
    assert res["elapsed"] < 8 + 4, res["elapsed"]
    assert "rank 1: rendezvous at" in res["message"] and "never returned" in res["message"], res["message"]
    # Retrying in the same process would race the abandoned, still blocked thread: refused at once.
    assert res["again"].startswith("RendezvousError: rank 1: an earlier rendezvous of this process is still blocked")
    assert "attempt 1 blocked in join" in res["again"]


@pytest.mark.timeout(90)
def test_second_job_on_the_same_port_is_told_to_pick_another_port(launcher: Launcher, port: int) -> None:
    """Job A (world 2) formed and runs; job B (world 2, same port, no job id) starts: B's ranks are told another
    job uses MASTER_PORT (naming A's process), not to fix NODE_RANK or stop A; A is not disturbed."""
    a = [launcher.start(r, 2, port, kwargs=SHORT, hold=20, name=f"jobA-rank{r}") for r in (0, 1)]
    _wait_for_log(a[0], "process group formed", 40)
    _wait_for_log(a[1], "process group formed", 40)
    b = [launcher.start(r, 2, port, kwargs=SHORT, name=f"jobB-rank{r}") for r in (0, 1)]
    for res in (h.result(40) for h in b):
        assert res["error"] == "PortInUseError", res
        assert res["elapsed"] < 8, res["elapsed"]
        assert f"another job is using MASTER_PORT={port}" in res["message"], res["message"]
        assert any(f"pid {h.proc.pid}" in res["message"] for h in a), res["message"]
        assert "fix: pick another port" in res["message"] and "NODE_RANK" not in res["message"]
    assert all(h.result(60)["ok"] for h in a)
