"""A joined rank frozen longer than the loss bound (SIGSTOP, a thread holding the GIL): rank 0 declares it lost, and
every rank -- the frozen one when it resumes, a late one -- raises a verdict naming the frozen rank, never rank 0.

World of 3, rank 2 not started at first (so the join cannot complete), rank 1 frozen after it joined.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from init_launch import Launcher, Rank

KWARGS = {"deadline": 60, "attempt_timeout": 20, "backoff": {"initial": 0.5, "jitter": 0.1}}
STATE = "distinit/job/0/c1/g0/state"


def _client(port: int):  # type: ignore[no-untyped-def]
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))


def _joined(store, rank: int) -> None:  # type: ignore[no-untyped-def]
    store.wait([f"distinit/job/0/c1/g0/beat/{rank}"], timedelta(seconds=60))


def _verdict_published(store) -> str:  # type: ignore[no-untyped-def]
    store.wait([STATE], timedelta(seconds=60))
    return str(store.get(STATE).decode())


def _assert_names_rank_1(res: dict[str, object]) -> None:
    assert res["error"] == "RankLostError", res
    assert res["ranks"] == [1], res["message"]  # the frozen rank, never rank 0


@pytest.mark.timeout(120)
def test_frozen_rank_resumed_within_the_linger_reads_the_published_verdict(
    launcher: Launcher, port: int, tmp_path: Path
) -> None:
    """SIGCONT as soon as rank 0 published: rank 1 and a late rank 2 raise rank 0's verdict, word for word."""
    go = tmp_path / "go"
    r0 = launcher.start(0, 3, port, kwargs=KWARGS)
    r1 = launcher.start(1, 3, port, kwargs=KWARGS)
    r2 = launcher.start(2, 3, port, kwargs=KWARGS, extra={"after_file": str(go)})
    store = _client(port)
    _joined(store, 1)
    time.sleep(1.5)  # a beat seen by rank 0's watcher
    os.kill(r1.proc.pid, signal.SIGSTOP)
    try:
        verdict = _verdict_published(store)
    finally:
        os.kill(r1.proc.pid, signal.SIGCONT)
    go.touch()
    assert '"ranks": [1]' in verdict, verdict
    results = [h.result(40) for h in (r0, r1, r2)]
    for res in results:
        _assert_names_rank_1(res)
    heads = {str(res["message"]).splitlines()[0] for res in results}
    assert len(heads) == 1, heads  # one verdict, the same text on every rank


@pytest.mark.timeout(120)
def test_frozen_rank_resumed_after_the_host_left_names_itself(launcher: Launcher, port: int) -> None:
    """SIGCONT after rank 0 raised and left: rank 1 finds the store gone and says it was the one frozen."""
    r0 = launcher.start(0, 3, port, kwargs=KWARGS)
    r1: Rank = launcher.start(1, 3, port, kwargs=KWARGS)
    store = _client(port)
    _joined(store, 1)
    time.sleep(1.5)
    os.kill(r1.proc.pid, signal.SIGSTOP)
    try:
        res0 = r0.result(40)
    finally:
        os.kill(r1.proc.pid, signal.SIGCONT)
    del store
    _assert_names_rank_1(res0)
    res1 = r1.result(40)
    _assert_names_rank_1(res1)
    assert "this process) was frozen for" in str(res1["message"]), res1["message"]
    assert "DISTINIT_LOSS_BOUND" in str(res1["message"])


@pytest.mark.timeout(120)
def test_rank_whose_thread_holds_the_gil_is_the_one_named(launcher: Launcher, port: int, tmp_path: Path) -> None:
    """A thread of rank 1 holds the GIL for 10 s after it joined (its heartbeat cannot run): every rank names rank 1."""
    hold = tmp_path / "hold"
    r0 = launcher.start(0, 3, port, kwargs=KWARGS)
    r1 = launcher.start(1, 3, port, kwargs=KWARGS, extra={"hold_gil_after": str(hold), "hold_gil_s": 10})
    store = _client(port)
    _joined(store, 1)
    time.sleep(1.5)
    hold.touch()
    del store
    for res in (r0.result(60), r1.result(60)):
        _assert_names_rank_1(res)
