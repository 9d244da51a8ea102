"""The report of a distributed test: per-rank summaries, ordering, stack cleaning, pickling."""

from __future__ import annotations

import copy
import pickle

import pytest

from distinit.errors import DistributedTestError
from distinit.testing._report import RankOutcome, build_error, clean_stack, first_failed_rank, prefix_lines

TB = 'Traceback (most recent call last):\n  File "t.py", line 3, in f\n    raise ValueError("boom")\nValueError: boom\n'


def _raised(rank: int, seq: int, message: str = "boom", phase: str = "run") -> RankOutcome:
    outcome = RankOutcome(rank, phase=phase, failed_seq=seq)
    outcome.record(("error", phase, "ValueError", message, TB))
    return outcome


SUMMARIES = [
    pytest.param(_raised(1, 1), "raised ValueError: boom", id="raised"),
    pytest.param(
        _raised(1, 1, phase="init"), "raised ValueError: boom while initialising the process group", id="init"
    ),
    pytest.param(RankOutcome(1, phase="run", exitcode=3, failed_seq=1), "exited with code 3", id="exit-code"),
    pytest.param(
        RankOutcome(1, phase="run", exitcode=3, result=b"x", failed_seq=1),
        "exited with code 3 after returning its result",
        id="exit-after",
    ),
    pytest.param(
        RankOutcome(1, phase="run", exitcode=-9, failed_seq=1), "was killed by SIGKILL (exit code -9)", id="sigkill"
    ),
    pytest.param(
        RankOutcome(1, phase="run", exitcode=-11, failed_seq=1), "was killed by SIGSEGV (exit code -11)", id="segv"
    ),
    pytest.param(
        RankOutcome(1, phase="run", exitcode=0, failed_seq=1),
        "exited with code 0 without returning a result",
        id="exit-0",
    ),
    pytest.param(RankOutcome(1, phase="run", verdict="hung"), "hung: still running after the 2 s timeout", id="hung"),
    pytest.param(
        RankOutcome(1, verdict="hung", phase="init"),
        "hung while initialising the process group: still running after the 2 s timeout",
        id="hung-in-init",
    ),
]


@pytest.mark.parametrize(("outcome", "summary"), SUMMARIES)
def test_summaries(outcome: RankOutcome, summary: str) -> None:
    assert outcome.summary(timeout=2, first_failed=None) == summary


def test_system_exit_and_long_messages() -> None:
    outcome = RankOutcome(0)
    outcome.record(("error", "run", "SystemExit", "sys.exit(3)", ""))
    assert outcome.summary(timeout=1, first_failed=None) == "called sys.exit(3)"
    long = _raised(0, 1, message="x" * 500)
    assert len(long.summary(timeout=1, first_failed=None)) < 200


def test_peer_loss_is_marked_as_a_consequence_and_not_first() -> None:
    peer = _raised(0, 1, message="[pair.cc:553] Connection closed by peer [127.0.0.1]:1234")
    dead = RankOutcome(1, phase="run", exitcode=-9, failed_seq=2)
    assert first_failed_rank([peer, dead]) == 1
    error = build_error([peer, dead], world_size=2, backend="gloo", timeout=30, label="t.py::test")
    assert error.ranks == (0, 1)
    lines = str(error).splitlines()
    assert lines[0] == "2 of 2 ranks failed in t.py::test (backend='gloo', timeout=30 s)"
    assert lines[1] == "  rank 1 was killed by SIGKILL (exit code -9)"
    assert lines[2].endswith("(a consequence: rank 1 failed first)")


def test_stopped_ranks_are_listed_after_the_failed_ones_with_their_stack_and_output() -> None:
    failed = _raised(1, 1)
    failed.stdout = "hello\n"
    stopped = RankOutcome(
        0,
        phase="run",
        verdict="stopped",
        stack='Current thread 0x1 (most recent call first):\n  File "t.py", line 9 in f\n',
    )
    error = build_error([stopped, failed], world_size=2, backend="gloo", timeout=30, label="")
    assert error.failures == {1: "raised ValueError: boom"}
    text = str(error)
    assert text.splitlines()[:3] == [
        "1 of 2 ranks failed (backend='gloo', timeout=30 s)",
        "  rank 1 raised ValueError: boom",
        "  rank 0 was stopped by the harness after rank 1 failed (it was still running)",
    ]
    assert "======== rank 1: raised ValueError: boom ========" in text
    assert "[rank 1] hello" in text
    assert 'File "t.py", line 9 in f' in error.details[0]


def test_error_pickles_and_copies_with_its_facts() -> None:
    error = build_error([_raised(1, 1), RankOutcome(0)], world_size=2, backend="gloo", timeout=5, label="x")
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert isinstance(clone, DistributedTestError)
        assert clone.failures == error.failures
        assert clone.details == error.details
        assert clone.world_size == 2
        assert str(clone) == str(error)


def test_clean_stack_drops_the_harness() -> None:
    dump = (
        "Thread 0x2 (most recent call first):\n"
        '  File "/x/distinit/testing/_child.py", line 122 in watch\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
        "\n"
        "Current thread 0x1 (most recent call first):\n"
        '  File "/x/torch/distributed/distributed_c10d.py", line 5356 in barrier\n'
        '  File "/t/test_x.py", line 7 in test_x\n'
        '  File "/x/distinit/testing/_child.py", line 254 in _run_task\n'
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run\n'
        '  File "<string>", line 1 in <module>\n'
    )
    assert clean_stack(dump) == (
        "Current thread 0x1 (most recent call first):\n"
        '  File "/x/torch/distributed/distributed_c10d.py", line 5356 in barrier\n'
        '  File "/t/test_x.py", line 7 in test_x'
    )


def test_prefix_lines() -> None:
    assert prefix_lines("a\nb", 3) == "[rank 3] a\n[rank 3] b\n"
    assert prefix_lines("a\n", 0) == "[rank 0] a\n"


def test_the_reason_for_a_status_0_exit_does_not_say_non_zero() -> None:
    error = build_error(
        [RankOutcome(0, result=b"x", exitcode=0), RankOutcome(1, phase="run", exitcode=0, failed_seq=1)],
        world_size=2,
        backend="gloo",
        timeout=30,
        label="",
    )
    assert error.failures == {1: "exited with code 0 without returning a result"}
    assert "status 0 before finishing the test body" in error.why
    assert "non-zero" not in str(error)


def test_a_non_zero_exit_still_gives_the_non_zero_reason() -> None:
    error = build_error(
        [RankOutcome(0, phase="run", exitcode=0, failed_seq=2), RankOutcome(1, phase="run", exitcode=3, failed_seq=1)],
        world_size=2,
        backend="gloo",
        timeout=30,
        label="",
    )
    assert "non-zero status" in error.why
