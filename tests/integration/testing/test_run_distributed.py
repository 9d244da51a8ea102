"""run_distributed on real gloo process groups: results, environment, and every failure shape."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from distinit.errors import DistributedTestError
from distinit.testing import DistWorld, run_distributed

pytestmark = pytest.mark.timeout(60)


def all_reduce_rank(offset: int, *, scale: int = 1) -> int:
    tensor = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(tensor)
    return int(tensor) * scale


def world_facts() -> dict[str, Any]:
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MY_VAR")},
        "pid": os.getpid(),
    }


def test_returns_per_rank_results_in_rank_order() -> None:
    assert run_distributed(all_reduce_rank, world_size=2, args=(1,), kwargs={"scale": 10}) == [30, 30]


def test_each_rank_is_its_own_process_with_the_group_and_env(dist_world: DistWorld) -> None:
    facts = dist_world(world_facts, world_size=3, env={"MY_VAR": "x"})
    assert [f["rank"] for f in facts] == [0, 1, 2]
    assert {f["world_size"] for f in facts} == {3}
    assert {f["backend"] for f in facts} == {"gloo"}
    assert [f["env"]["RANK"] for f in facts] == ["0", "1", "2"]
    assert {f["env"]["WORLD_SIZE"] for f in facts} == {"3"}
    assert {f["env"]["MY_VAR"] for f in facts} == {"x"}
    assert len({f["pid"] for f in facts} | {os.getpid()}) == 4


def init_from_env() -> int:
    assert not dist.is_initialized()
    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return int(tensor)


def test_init_false_gives_a_race_free_env_rendezvous() -> None:
    assert run_distributed(init_from_env, world_size=2, init=False) == [2, 2]


def raise_on_rank_1(stamp: str) -> None:
    if dist.get_rank() == 1:
        print("rank one speaking")
        with open(stamp, "w") as handle:
            handle.write(repr(time.time()))
        raise ValueError("boom on rank 1")
    dist.barrier()


def test_exception_on_one_rank_names_it_and_stops_the_others_fast(tmp_path: Any) -> None:
    stamp = tmp_path / "raised"
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(raise_on_rank_1, world_size=3, args=(str(stamp),))
    raise_to_report = time.time() - float(stamp.read_text())
    error = caught.value
    assert error.ranks == (1,)
    assert error.failures[1] == "raised ValueError: boom on rank 1"
    text = str(error)
    assert text.splitlines()[0] == (
        "1 of 3 ranks failed in tests/integration/testing/test_run_distributed.py::"
        "test_exception_on_one_rank_names_it_and_stops_the_others_fast (backend='gloo', timeout=30 s)"
    )
    assert "  rank 0 was stopped by the harness after rank 1 failed (it was still running)" in text
    assert 'raise ValueError("boom on rank 1")' in text
    assert "[rank 1] rank one speaking" in text
    # the stopped ranks show where they were waiting
    assert "in barrier" in error.details[0]
    assert "in raise_on_rank_1" in error.details[2]
    assert raise_to_report < 2 + 2  # target 2 s; slack for 2 shared cores


def exit_after_last_collective() -> int:
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(3)
    return 0


def test_non_zero_exit_after_the_last_collective_fails() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(exit_after_last_collective, world_size=2)
    assert caught.value.failures == {1: "exited with code 3"}


def sigkill_rank_1() -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_sigkill_is_reported_with_the_signal_name() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(sigkill_rank_1, world_size=2)
    failures = caught.value.failures
    assert failures[1] == "was killed by SIGKILL (exit code -9)"
    # rank 0 either saw its peer go away, or was still waiting when torn down
    assert 0 not in failures or "(a consequence: rank 1 failed first)" in failures[0]
    assert str(caught.value).splitlines()[1] == "  rank 1 was killed by SIGKILL (exit code -9)"


def segfault_rank_0() -> None:
    if dist.get_rank() == 0:
        ctypes.string_at(0)
    dist.barrier()


def test_segfault_shows_the_python_stack_of_the_crash() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(segfault_rank_0, world_size=2)
    assert caught.value.failures[0] == "was killed by SIGSEGV (exit code -11)"
    assert "[rank 0] Fatal Python error: Segmentation fault" in caught.value.details[0]
    assert "in segfault_rank_0" in caught.value.details[0]


def hang_in_collective(stamp: str) -> None:
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        with open(stamp, "w") as handle:
            handle.write(repr(time.time()))
        time.sleep(600)


def test_hang_reports_every_rank_stack_after_the_timeout(tmp_path: Any) -> None:
    stamp = tmp_path / "hung"
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(hang_in_collective, world_size=2, timeout=2, args=(str(stamp),))
    hang_to_report = time.time() - float(stamp.read_text())
    error = caught.value
    assert error.failures == {
        0: "hung: still running after the 2 s timeout",
        1: "hung: still running after the 2 s timeout",
    }
    assert "in barrier" in error.details[0]
    assert "in hang_in_collective" in error.details[1]
    assert "distinit-parent-watch" not in str(error)
    assert hang_to_report < 2 + 3  # target: timeout + 3 s


def hang_before_init() -> None:
    if os.environ["RANK"] == "1":
        time.sleep(600)
    dist.init_process_group("gloo")


def test_hang_before_init_shows_the_waiting_ranks() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(hang_before_init, world_size=2, timeout=2, init=False)
    assert set(caught.value.failures) == {0, 1}
    assert "init_process_group" in caught.value.details[0]
    assert "in hang_before_init" in caught.value.details[1]


def crash_before_init() -> None:
    raise AssertionError("unreachable")


def test_crash_before_init_names_the_phase() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(crash_before_init, world_size=2, env={"GLOO_SOCKET_IFNAME": "no-such-nic0"})
    failures = caught.value.failures
    assert failures
    assert all(text.endswith("while initialising the process group") for text in failures.values())


def test_functions_that_cannot_be_sent_are_refused_up_front() -> None:
    with pytest.raises(TypeError, match="module level"):
        run_distributed(lambda: 1)
    with pytest.raises(ValueError, match="world_size"):
        run_distributed(all_reduce_rank, world_size=0)
    with pytest.raises(ValueError, match="timeout"):
        run_distributed(all_reduce_rank, timeout=0)


def pid_and_sum() -> tuple[int, int]:
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return os.getpid(), int(tensor)


def fail_on_rank_0() -> None:
    if dist.get_rank() == 0:
        raise RuntimeError("poison")


def test_reuse_keeps_processes_and_a_failure_replaces_the_pool() -> None:
    first = run_distributed(pid_and_sum, reuse=True)
    second = run_distributed(pid_and_sum, reuse=True)
    assert first == second
    assert [total for _, total in first] == [2, 2]
    with pytest.raises(DistributedTestError):
        run_distributed(fail_on_rank_0, reuse=True)
    third = run_distributed(pid_and_sum, reuse=True)
    assert not {pid for pid, _ in third} & {pid for pid, _ in first}
    assert [total for _, total in third] == [2, 2]


def chdir_and_init(path: str) -> int:
    os.chdir(path)
    return init_from_env()


def test_reuse_cleans_a_group_the_test_made_and_its_cwd(tmp_path: Any) -> None:
    cwd = os.getcwd()
    for _ in range(2):
        assert run_distributed(chdir_and_init, init=False, reuse=True, args=(str(tmp_path),)) == [2, 2]
    assert run_distributed(os.getcwd, reuse=True) == [cwd, cwd]


def exit_non_zero_at_interpreter_exit() -> int:
    import atexit

    if dist.get_rank() == 1:
        atexit.register(os._exit, 4)  # as a library's exit hook that aborts would
    return dist.get_rank()


def test_non_zero_exit_after_returning_fails() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(exit_non_zero_at_interpreter_exit, world_size=2)
    assert caught.value.failures == {1: "exited with code 4 after returning its result"}


def exit_zero_on_rank_1() -> int:
    if dist.get_rank() == 1:
        os._exit(0)
    return 0


def test_exit_with_status_0_mid_test_is_not_called_non_zero() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(exit_zero_on_rank_1, world_size=2)
    error = caught.value
    assert error.failures == {1: "exited with code 0 without returning a result"}
    assert "exited with status 0 before finishing the test body" in error.why
    assert "non-zero" not in str(error)
