"""Hangs inside real pytest sessions: with pytest-timeout (both methods), when it fires first, under xdist."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(150)

HANGS = """
import os
import time

import pytest
import torch.distributed as dist

from distinit.testing import run_distributed


def total():
    return dist.get_world_size()


@pytest.mark.timeout(120)
def test_0_warm_up(dist_world):
    # The first test of a session waits for the fork server to import torch; on a loaded machine
    # that alone can exceed the short pytest-timeout the hang tests below run under.
    assert dist_world(total, world_size=2) == [2, 2]


def hang_on_rank_1():
    with open(os.path.join(os.environ["PIDS_DIR"], str(os.getpid())), "w"):
        pass
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=60)
def test_marker_hang():
    hang_on_rank_1()


def test_fixture_hang(dist_world):
    dist_world(hang_on_rank_1, world_size=2, timeout=60)


def test_direct_call_interrupted_by_pytest_timeout():
    run_distributed(hang_on_rank_1, world_size=2, timeout=60)


def test_after():
    pass
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # zombies are dead
    except OSError:
        return False


def _assert_ranks_gone(pids_dir: Path, *, within: float) -> None:
    pids = [int(p.name) for p in pids_dir.iterdir()]
    assert pids, "the ranks never started"
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], "rank processes outlived their test"


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_our_deadline_comes_before_pytest_timeout(
    pytester: pytest.Pytester, plugin_args: list[str], monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    pids = pytester.mkdir("pids")
    monkeypatch.setenv("PIDS_DIR", str(pids))
    pytester.makepyfile(test_hangs=HANGS)
    result = pytester.runpytest_subprocess(
        *plugin_args,
        "-p",
        "no:cacheprovider",
        "-o",
        "timeout=5",
        "-o",
        f"timeout_method={method}",
        "-k",
        "warm_up or marker_hang or fixture_hang or after",
        timeout=120,
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "E   distinit.errors.DistributedTestError: 2 of 2 ranks failed in test_hangs.py::test_marker_hang "
            "(backend='gloo', timeout=* s)",
            "      rank 0 hung: still running after the * s timeout",
        ]
    )
    result.stdout.fnmatch_lines(
        ["E *distinit.errors.DistributedTestError: 2 of 2 ranks failed in test_hangs.py::test_fixture_hang *"]
    )
    result.stdout.no_fnmatch_line("*+++ Timeout +++*")
    _assert_ranks_gone(pids, within=1)


def test_pytest_timeout_signal_interrupts_and_the_ranks_are_torn_down(
    pytester: pytest.Pytester, plugin_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = pytester.mkdir("pids")
    monkeypatch.setenv("PIDS_DIR", str(pids))
    pytester.makepyfile(test_hangs=HANGS)
    result = pytester.runpytest_subprocess(
        *plugin_args,
        "-p",
        "no:cacheprovider",
        "-o",
        "timeout=3",
        "-o",
        "timeout_method=signal",
        "-k",
        "warm_up or direct_call or after",
        timeout=120,
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Failed: Timeout (>3.0s) from pytest-timeout.",
            "E *distinit: the ranks were torn down when the test was interrupted:",
            "E *the ranks were stopped in test_hangs.py::test_direct_call_interrupted_by_pytest_timeout *",
            "E *rank 0 was stopped when the test was interrupted (it was still running)",
            "E *in barrier",
        ]
    )
    _assert_ranks_gone(pids, within=1)


def test_pytest_timeout_thread_ends_the_session_and_no_rank_survives(
    pytester: pytest.Pytester, plugin_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = pytester.mkdir("pids")
    monkeypatch.setenv("PIDS_DIR", str(pids))
    pytester.makepyfile(test_hangs=HANGS)
    result = pytester.runpytest_subprocess(
        *plugin_args,
        "-p",
        "no:cacheprovider",
        "-o",
        "timeout=3",
        "-o",
        "timeout_method=thread",
        "-k",
        "warm_up or direct_call",
        timeout=120,
    )
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*+++ Timeout +++*"])
    _assert_ranks_gone(pids, within=5)


XDIST = """
import time

import pytest
import torch
import torch.distributed as dist


def total():
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return int(tensor)


@pytest.mark.parametrize("n", [2, 3])
def test_fixture(dist_world, n):
    assert dist_world(total, world_size=n) == [n] * n


@pytest.mark.distributed(world_size=2, timeout=20)
def test_marker():
    assert total() == 2


@pytest.mark.distributed(world_size=2, timeout=20)
def test_raises():
    assert dist.get_rank() == 0


@pytest.mark.distributed(world_size=2, timeout=2)
def test_hangs():
    if dist.get_rank() == 0:
        time.sleep(600)
    dist.barrier()
"""


def test_under_xdist_each_worker_has_its_own_ranks(pytester: pytest.Pytester, plugin_args: list[str]) -> None:
    pytester.makepyfile(test_xdist=XDIST)
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", "-n", "2", timeout=120)
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*rank 1 raised AssertionError: assert 1 == 0*"])
    result.stdout.fnmatch_lines(["*rank 0 hung: still running after the 2 s timeout*"])


def test_pids_dir_is_not_leaked() -> None:
    assert "PIDS_DIR" not in os.environ
