"""The rendezvous never outlives a caller that was told it failed (issue 12, items 20-22): infinite and huge
durations, Ctrl-C during the wait, and two threads of one process calling at once. Real processes, gloo."""

from __future__ import annotations

import math
import os
import signal
import time
from datetime import timedelta

import pytest
from init_launch import Launcher
from torch.distributed import TCPStore

BACKOFF = {"initial": 0.3, "jitter": 0.1}


def _wait_for_file(path: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


@pytest.mark.timeout(90)
def test_infinite_and_huge_durations_form_the_world(launcher: Launcher, port: int) -> None:
    """deadline=inf / 1e300 and pg_timeout=inf reached Thread.join and timedelta: OverflowError at once,
    while the rendezvous thread ran on and formed the group behind the caller's back."""
    master = launcher.start(0, 2, port, kwargs={"deadline": math.inf, "pg_timeout": math.inf, "backoff": BACKOFF})
    worker = launcher.start(
        1,
        2,
        port,
        kwargs={"deadline": 1e300, "attempt_timeout": 1e300, "backoff": BACKOFF},
        start_after=2,
        after=master,
    )
    res0, res1 = master.result(60), worker.result(60)
    assert res0["ok"] and res1["ok"], (res0, res1)
    assert res0["elapsed"] > 1.5  # it really waited for the late rank instead of failing at once
    assert "OverflowError" not in res0["log"] + res1["log"]


@pytest.mark.timeout(300)  # two interpreter start-ups beside the burners, each bounded below
@pytest.mark.parametrize("load", ["quiet", "beside-burners"])
def test_ctrl_c_during_the_wait_abandons_the_rendezvous(
    launcher: Launcher, port: int, load: str, request: pytest.FixtureRequest
) -> None:
    """Ctrl-C while rank 0 waits for rank 1: the call returns at once (within 2 s, also beside two busy loops
    per core), its store goes away, no group forms behind the caller when rank 1 comes, and the next call in
    the same process forms the world."""
    if load == "beside-burners":
        request.getfixturevalue("burners")
    late_name = "rank1-late"
    peer_started = str(launcher.tmp_path / f"{late_name}.json.started")
    kwargs = {"deadline": 60, "attempt_timeout": 10, "backoff": BACKOFF}
    master = launcher.start(0, 2, port, kwargs=kwargs, mode="interrupted", extra={"peer_started": peer_started})
    # Rank 0's interpreter imports torch first (tens of seconds beside the burners on a loaded machine): wait
    # for it to reach init, then for its store (the probe's own 30 s cover hosting the store, not imports).
    _wait_for_file(str(master.out) + ".started", 120)
    probe = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    probe.wait(["distinit/job/0/c1/g0/claim/0"], timedelta(seconds=30))  # rank 0 joined and waits for rank 1
    del probe
    time.sleep(0.5)
    interrupted = time.time()
    os.kill(master.proc.pid, signal.SIGINT)
    _wait_for_file(str(master.out) + ".interrupted", 20)
    late = launcher.start(1, 2, port, kwargs=kwargs, name=late_name)
    res0, res1 = master.result(90), late.result(90)
    assert res0["ok"] and res1["ok"], (res0, res1)
    assert res0["interrupted_at"] - interrupted < 2  # Ctrl-C returned promptly
    assert res0["store_closed_after"] is not None and res0["store_closed_after"] < 3, res0["store_closed_after"]
    assert res0["formed_behind"] is False  # the abandoned call never installed a group
    assert res0["report"]["generation"] == res1["report"]["generation"]  # the second call met rank 1's first


@pytest.mark.timeout(120)
def test_setup_from_two_threads_returns_the_one_result_at_once(launcher: Launcher, port: int) -> None:
    """Two threads of rank 0 call setup() at once: one rendezvous, both get its result in seconds
    (before: the second waited its whole deadline and blamed rank 1, which was present)."""
    kwargs = {"deadline": 30, "attempt_timeout": 10}
    master = launcher.start(0, 2, port, kwargs=kwargs, mode="threads", extra={"call": "setup"})
    worker = launcher.start(1, 2, port, kwargs=kwargs)
    res0, res1 = master.result(90), worker.result(90)
    assert res1["ok"], res1
    assert res0["ok"], res0["threads"]
    assert res0["same"] is True  # the very same SetupResult
    assert all(t["elapsed"] < 20 for t in res0["threads"]), res0["threads"]


@pytest.mark.timeout(120)
def test_init_with_retry_from_two_threads_of_a_client_rank(launcher: Launcher, port: int) -> None:
    kwargs = {"deadline": 30, "attempt_timeout": 10}
    master = launcher.start(0, 2, port, kwargs=kwargs)
    worker = launcher.start(1, 2, port, kwargs=kwargs, mode="threads", extra={"call": "init"})
    res0, res1 = master.result(90), worker.result(90)
    assert res0["ok"], res0
    assert res1["ok"], res1["threads"]
    assert all(t["elapsed"] < 20 for t in res1["threads"]), res1["threads"]
