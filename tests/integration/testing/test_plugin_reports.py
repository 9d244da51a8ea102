"""The plugin through real pytest sessions: every failure shape of a distributed test, with its report."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.timeout(150)
#: GPUs this machine has: the test that needs 1024 of them skips on every machine, naming the count.
GPUS = torch.cuda.device_count()

SHAPES = """
import ctypes
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=20)
def test_passes():
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert int(tensor) == 2


@pytest.mark.distributed(world_size=2, timeout=20)
@pytest.mark.parametrize("value", [1, 2])
def test_parametrized_with_fixtures(value, tmp_path):
    assert tmp_path.is_dir()
    tensor = torch.tensor([value])
    dist.all_reduce(tensor)
    assert int(tensor) == 2 * value


class TestInAClass:
    @pytest.mark.distributed(world_size=2, timeout=20)
    def test_method(self):
        assert dist.get_world_size() == 2


@pytest.mark.distributed(world_size=3, timeout=20)
def test_raise_on_rank_2():
    print(f"hello from {dist.get_rank()}")
    rank = dist.get_rank()
    assert rank != 2
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=20)
def test_exit_after_last_collective():
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(3)


@pytest.mark.distributed(world_size=2, timeout=20)
def test_sigkill_rank_1():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=20)
def test_segfault_rank_0():
    if dist.get_rank() == 0:
        ctypes.string_at(0)
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=2)
def test_hang_in_collective():
    if dist.get_rank() == 0:
        dist.barrier()
    time.sleep(600)


@pytest.mark.distributed(world_size=2, timeout=2, init=False)
def test_hang_before_init():
    if os.environ["RANK"] == "1":
        time.sleep(600)
    dist.init_process_group("gloo")


@pytest.mark.distributed(world_size=2, timeout=20, init=False)
def test_crash_before_init():
    if os.environ["RANK"] == "1":
        os._exit(7)
    dist.init_process_group("gloo")


@pytest.mark.distributed(world_size=2, backend="nccl", gpus_per_rank=512)
def test_needs_gpus():
    raise AssertionError("must not run without GPUs")


@pytest.mark.distributed(world_size=2, timeout=20)
def test_every_rank_skips():
    pytest.skip("not on this world")


@pytest.mark.distributed(world_size=2, timeout=20, reuse=True)
def test_reuse_first():
    assert dist.get_world_size() == 2


@pytest.mark.distributed(world_size=2, timeout=20, reuse=True)
def test_reuse_poisoned():
    torch.manual_seed(1234)
    raise RuntimeError(f"poison from {os.getpid()}")


@pytest.mark.distributed(world_size=2, timeout=20, reuse=True)
def test_reuse_after_a_failure_gets_fresh_ranks():
    assert torch.initial_seed() != 1234
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert int(tensor) == 2


@pytest.mark.distributed(world_sise=2)
def test_misspelt_marker_argument():
    pass


def test_plain_test_after_the_failures():
    pass
"""


def test_every_failure_shape_reports_each_failed_rank(pytester: pytest.Pytester, plugin_args: list[str]) -> None:
    pytester.makepyfile(test_shapes=SHAPES)
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", "-rs", timeout=140)
    result.assert_outcomes(passed=7, failed=9, skipped=2)
    out = result.stdout
    out.fnmatch_lines(
        [
            "*_ test_raise_on_rank_2 _*",
            "E   distinit.errors.DistributedTestError: 1 of 3 ranks failed in "
            "test_shapes.py::test_raise_on_rank_2 (backend='gloo', timeout=20 s)",
            "      rank 2 raised AssertionError: assert 2 != 2",
            "      rank 0 was stopped by the harness after rank 2 failed (it was still running)",
            "      rank 1 was stopped by the harness after rank 2 failed (it was still running)",
            "    ======== rank 2: raised AssertionError: assert 2 != 2 ========",
            "    Traceback (most recent call last):",
            '      File "*test_shapes.py", line *, in test_raise_on_rank_2',
            "        assert rank != 2",
            "    AssertionError: assert 2 != 2",
            "    -------- rank 2 stdout --------",
            "    [[]rank 2[]] hello from 2",
            "    ======== rank 0: was stopped by the harness after rank 2 failed (it was still running) ========",
            "    Python stack of rank 0 when it was stopped (faulthandler):",
            "*in barrier",
            '*File "*test_shapes.py", line * in test_raise_on_rank_2',
        ]
    )
    out.fnmatch_lines(
        [
            "*_ test_exit_after_last_collective _*",
            "E   distinit.errors.DistributedTestError: 1 of 2 ranks failed in "
            "test_shapes.py::test_exit_after_last_collective (backend='gloo', timeout=20 s)",
            "      rank 1 exited with code 3",
        ]
    )
    out.fnmatch_lines(
        [
            "*_ test_sigkill_rank_1 _*",
            "E   distinit.errors.DistributedTestError: * of 2 ranks failed in test_shapes.py::test_sigkill_rank_1 *",
            "      rank 1 was killed by SIGKILL (exit code -9)",
        ]
    )
    out.fnmatch_lines(
        [
            "*_ test_segfault_rank_0 _*",
            "E   distinit.errors.DistributedTestError: * of 2 ranks failed in test_shapes.py::test_segfault_rank_0 *",
            "      rank 0 was killed by SIGSEGV (exit code -11)",
            "*[[]rank 0[]] Fatal Python error: Segmentation fault",
        ]
    )
    out.fnmatch_lines(
        [
            "*_ test_hang_in_collective _*",
            "E   distinit.errors.DistributedTestError: 2 of 2 ranks failed in "
            "test_shapes.py::test_hang_in_collective (backend='gloo', timeout=2 s)",
            "      rank 0 hung: still running after the 2 s timeout",
            "      rank 1 hung: still running after the 2 s timeout",
            "      why: a rank waited for a peer or a collective that never came*",
            "    ======== rank 0: hung: still running after the 2 s timeout ========",
            "*in barrier",
            "    ======== rank 1: hung: still running after the 2 s timeout ========",
            '*File "*test_shapes.py", line * in test_hang_in_collective',
        ]
    )
    out.fnmatch_lines(
        [
            "*_ test_hang_before_init _*",
            "E   distinit.errors.DistributedTestError: 2 of 2 ranks failed in test_shapes.py::test_hang_before_init *",
            "      rank 0 hung: still running after the 2 s timeout",
            "      rank 1 hung: still running after the 2 s timeout",
            "*in init_process_group",
        ]
    )
    out.fnmatch_lines(
        [
            "*_ test_crash_before_init _*",
            "E   distinit.errors.DistributedTestError: 1 of 2 ranks failed in test_shapes.py::test_crash_before_init *",
            "      rank 1 exited with code 7",
            "      rank 0 was stopped by the harness after rank 1 failed (it was still running)",
            "*in init_process_group",
        ]
    )
    out.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_shapes.py:*: needs 1024 CUDA GPU(s) (world_size=2 x gpus_per_rank=512), "
            f"found {GPUS}",
            "SKIPPED [[]1[]] test_shapes.py:*: all 2 ranks skipped: not on this world",
        ]
    )
    out.fnmatch_lines(
        [
            "test_shapes.py::test_misspelt_marker_argument: unknown @pytest.mark.distributed argument(s) "
            "[[]'world_sise'[]]; known: *"
        ]
    )
    out.no_fnmatch_line("*distinit-parent-watch*")


BAD_TIMEOUT = """
import pytest


@pytest.mark.distributed(world_size=2)
def test_never_runs():
    pass
"""


@pytest.mark.parametrize("option", ["distributed_timeout=abc", "distributed_timeout=-5"])
def test_a_bad_ini_value_is_a_usage_error_not_an_internal_error(
    pytester: pytest.Pytester, plugin_args: list[str], option: str
) -> None:
    pytester.makepyfile(test_bad_ini=BAD_TIMEOUT)
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", "-o", option, timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    key, value = option.split("=")
    result.stderr.fnmatch_lines([f"ERROR: ini option {key} = {value!r} is not a number of seconds > 0*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
