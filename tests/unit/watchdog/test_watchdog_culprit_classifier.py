"""Culprit or victim: the stack-dump classifier on real faulthandler output, the verdict, the batching."""

from __future__ import annotations

import faulthandler
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests._scripts import load_file

from distinit.watchdog._batch import gather, role_and_note
from distinit.watchdog._culprit import Finding, Member, assess, classify, judge, thread_frames
from distinit.watchdog._protocol import Identity

# Captured from the DDP test (tests/integration/watchdog/test_watchdog_culprit.py; torch 2.13, Python 3.11):
# the hung rank sleeping in its own step(), and a healthy rank blocked in backward() on DDP's all-reduce.
REAL_CULPRIT = """Current thread 0x00007fa25ee45b80 (most recent call first):
  File "/work/main/tests/integration/watchdog/wd_worker.py", line 171 in step
  File "/work/main/tests/integration/watchdog/wd_worker.py", line 177 in ddp
  File "/work/main/tests/integration/watchdog/wd_worker.py", line 228 in main
  File "/work/main/tests/integration/watchdog/wd_worker.py", line 232 in <module>
"""
REAL_VICTIM = """Current thread 0x00007f26f1681b80 (most recent call first):
  File "/work/main/.venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/work/main/.venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward
  File "/work/main/.venv/lib/python3.11/site-packages/torch/_tensor.py", line 623 in backward
  File "/work/main/tests/integration/watchdog/wd_worker.py", line 172 in step
  File "/work/main/tests/integration/watchdog/wd_worker.py", line 177 in ddp
"""


def test_real_ddp_dumps_classify_as_culprit_and_victim() -> None:
    assert classify(REAL_CULPRIT, 0x7FA25EE45B80) == Finding(
        "own_code", "integration/watchdog/wd_worker.py:171 in step"
    )
    assert classify(REAL_VICTIM, 0x7F26F1681B80) == Finding(
        "collective", "torch/autograd/graph.py:979 in _engine_run_backward"
    )


def _fake_torch_module(root: Path) -> Callable[[Any], None]:
    """``all_reduce`` loaded from ``<root>/torch/distributed/distributed_c10d.py``, blocking in C like gloo."""
    path = root / "torch" / "distributed" / "distributed_c10d.py"
    path.parent.mkdir(parents=True)
    path.write_text("def all_reduce(lock):\n    lock.acquire(timeout=30)\n")
    wait: Callable[[Any], None] = load_file(path, "fake_c10d_for_test").all_reduce
    return wait


def _my_own_loop(event: threading.Event) -> None:
    while not event.wait(0.01):  # the user's own code, polling: never in a collective
        pass


@pytest.fixture
def live_dump(tmp_path: Path) -> Iterator[tuple[str, int, int]]:
    """A faulthandler dump of this process: one thread in a 'collective', one in its own loop."""
    stop = threading.Event()
    held = threading.Lock()
    held.acquire()
    in_collective = threading.Thread(target=_fake_torch_module(tmp_path), args=(held,), daemon=True)
    own = threading.Thread(target=_my_own_loop, args=(stop,), daemon=True)
    in_collective.start()
    own.start()
    try:
        with tempfile.TemporaryFile("w+") as fh:
            threading.Event().wait(0.1)  # let both threads reach their wait
            faulthandler.dump_traceback(fh, all_threads=True)
            fh.seek(0)
            text = fh.read()
        assert in_collective.ident is not None and own.ident is not None
        yield text, in_collective.ident, own.ident
    finally:
        stop.set()
        held.release()
        in_collective.join(5)
        own.join(5)


def test_live_dump_each_thread_is_judged_by_its_own_frames(live_dump: tuple[str, int, int]) -> None:
    text, collective_thread, own_thread = live_dump
    waiting = classify(text, collective_thread)
    assert waiting.activity == "collective"
    assert waiting.where.endswith("torch/distributed/distributed_c10d.py:2 in all_reduce")
    own = classify(text, own_thread)
    assert own.activity == "own_code"  # innermost frame: threading.py's wait, called from the user's loop
    frames = thread_frames(text, own_thread)
    assert frames is not None and any(func == "_my_own_loop" for _, _, func in frames)


def test_unknown_thread_in_a_multi_thread_dump_is_unknown(live_dump: tuple[str, int, int]) -> None:
    text, _, _ = live_dump
    assert classify(text, 0x1234) == Finding("unknown")
    assert classify(None, 1) == Finding("unknown")
    assert classify("", 1) == Finding("unknown")
    assert classify("garbage\nwithout frames\n", 1) == Finding("unknown")


def test_a_single_thread_dump_is_used_whatever_the_ident() -> None:
    # faulthandler's all_threads=False format ("Stack (most recent call first):"), and one-thread dumps.
    single = (
        'Stack (most recent call first):\n  File "/opt/venv/lib/torch/distributed/c10d_logger.py", line 81 in wrapper\n'
    )
    assert classify(single, 99).activity == "collective"
    assert classify(REAL_CULPRIT, 42).activity == "own_code"


@pytest.mark.parametrize(
    ("frame", "activity"),
    [
        ('"/x/torch/nn/parallel/distributed.py", line 1 in forward', "collective"),
        ('"/x/torch/cuda/__init__.py", line 1 in synchronize', "collective"),
        # Where a frame is decides, never its name (issue 23 item 10): user code named after NCCL is user code.
        ('"/x/site-packages/mylib/comm.py", line 1 in ProcessGroupNCCL_wait', "own_code"),
        ('"/x/train.py", line 1 in nccl_allreduce_wait', "own_code"),
        ('"/x/gloo_helpers.py", line 1 in wait', "own_code"),
        ('"/x/mytorch/distributed/x.py", line 1 in barrier', "own_code"),
        ('"/x/train.py", line 1 in data_loader_next', "own_code"),
        ('"/usr/lib/python3.11/queue.py", line 1 in get', "own_code"),
    ],
)
def test_innermost_frame_decides(frame: str, activity: str) -> None:
    assert classify(f"Thread 0x10 (most recent call first):\n  File {frame}\n", 0x10).activity == activity


# Python 3.14's faulthandler adds the C stack; its frames are classified by the library they are in.
_C_STACK = "\nCurrent thread's C stack trace (most recent call first):\n"


@pytest.mark.parametrize(
    ("native", "activity"),
    [
        pytest.param('  Binary file "/usr/lib/libnccl.so.2", at ncclGroupEnd+0x1a [0x7f00]', "collective", id="nccl"),
        pytest.param('  Binary file "/x/torch/lib/libgloo.so", at +0x10 [0x7f00]', "collective", id="gloo"),
        pytest.param(
            '  Binary file "/x/torch/lib/libtorch_cpu.so", at _ZN4c10d16ProcessGroupGloo4waitEv+0x8 [0x7f00]',
            "collective",
            id="c10d-in-libtorch",
        ),
        pytest.param(
            '  Binary file "/x/torch/lib/libtorch_cpu.so", at _ZN2at6matmulEv+0x8 [0x7f00]',
            "own_code",
            id="libtorch-math",
        ),
        pytest.param('  Binary file "/x/libmine.so", at nccl_allreduce_wait+0x8 [0x7f00]', "own_code", id="named-nccl"),
    ],
)
def test_native_frames_are_judged_by_their_library(native: str, activity: str) -> None:
    dump = f'Current thread 0x10 (most recent call first):\n  File "/x/train.py", line 3 in step\n{_C_STACK}{native}\n'
    assert classify(dump, 0x10).activity == activity


def _member(rank: int | None, activity: str, armed_at: float, world: int | None = 4) -> Member:
    where = {"collective": "torch/autograd/graph.py:979 in _engine_run_backward", "own_code": "train.py:9 in step"}
    return Member(
        pid=1000 + (rank or 0),
        identity=Identity(rank=rank, local_rank=rank, world_size=world),
        armed_at=armed_at,
        finding=Finding(activity, where.get(activity, "")),  # type: ignore[arg-type]
    )


def test_the_rank_in_its_own_code_is_the_culprit_whatever_the_deadline_order() -> None:
    members = [_member(0, "collective", 10.0), _member(1, "collective", 10.1), _member(2, "own_code", 10.2)]
    verdict = judge(members, hold=2.0)
    assert [m.identity.rank for m in verdict.culprits] == [2]
    assert [m.identity.rank for m in verdict.victims] == [0, 1]
    assert verdict.likely is members[2]
    assert "likely culprit RANK 2 (pid 1002), running its own code at train.py:9 in step" in verdict.summary
    assert "entered its region 0.200 s after the first victim" in verdict.summary
    assert "victims RANK 0 (pid 1000), RANK 1 (pid 1001) blocked in a collective" in verdict.summary
    assert "after a 2 s hold" in verdict.summary
    assert "\n" not in verdict.summary  # one line


def test_several_suspects_the_earliest_to_enter_is_the_likely_culprit() -> None:
    members = [_member(0, "own_code", 5.0), _member(1, "collective", 3.0), _member(3, "own_code", 4.0)]
    verdict = judge(members, hold=1.0)
    assert [m.identity.rank for m in verdict.culprits] == [3, 0]
    assert "likely culprit RANK 3" in verdict.summary and "other suspects: RANK 0" in verdict.summary


def test_without_stacks_the_unreadable_ones_are_suspects_not_the_waiting_ones() -> None:
    verdict = judge([_member(0, "collective", 1.0), _member(1, "unknown", 1.0)], hold=1.0)
    assert [m.identity.rank for m in verdict.culprits] == [1]
    assert "with no readable stack" in verdict.summary


def test_all_waiting_in_a_collective_names_no_culprit_and_points_at_the_missing_ranks() -> None:
    verdict = judge([_member(0, "collective", 1.0), _member(3, "collective", 1.1)], hold=1.0)
    assert verdict.culprits == () and verdict.likely is None
    assert len(verdict.victims) == 2
    assert "the rank they wait for is not among them" in verdict.summary
    assert "ranks not among them: 1, 2" in verdict.summary


def test_independent_hangs_have_no_single_culprit() -> None:
    verdict = judge([_member(None, "own_code", 1.0, world=None), _member(None, "own_code", 2.0, world=None)], hold=1)
    assert verdict.culprits == ()
    assert "no single culprit" in verdict.summary and "pid 1000" in verdict.summary


def _worker(world: int | None) -> Any:
    return SimpleNamespace(identity=Identity(world_size=world))


def test_gather_batches_a_job_and_leaves_a_lone_expiry_alone() -> None:
    a, b, c, other_job = _worker(4), _worker(4), _worker(4), _worker(2)
    # a expired; b's deadline is within the window, c's is not; other_job's is, but it is another job.
    keys: dict[str, Any] = {"world": lambda m: m[0].identity.world_size, "deadline": lambda m: m[2]}
    batches = gather([(a, 0, 10.0)], [(b, None, 10.5), (c, None, 12.0), (other_job, None, 10.1)], 11.0, **keys)
    assert batches == [[(a, 0, 10.0), (b, None, 10.5)]]
    assert gather([(a, 0, 10.0)], [(c, None, 12.0)], 11.0, **keys) == [[(a, 0, 10.0)]]  # alone: killed at once
    two_jobs = gather([(a, 1, 10.0), (other_job, 2, 10.0)], [], 11.0, **keys)
    assert two_jobs == [[(a, 1, 10.0)], [(other_job, 2, 10.0)]]


class _Table:
    """A slot table stand-in: ``armed`` is {slot: deadline}."""

    def __init__(self, armed: dict[int, float]) -> None:
        self._armed = armed

    def armed(self) -> list[tuple[int, float]]:
        return list(self._armed.items())

    def deadline(self, slot: int) -> float:
        return self._armed.get(slot, 0.0)

    def slot_info(self, slot: int) -> tuple[float, float, str, int]:
        return (self._armed[slot], self._armed[slot] - 1.0, "step", 1)


class _Host:
    def __init__(self) -> None:
        from distinit.watchdog._ladder import LadderConfig

        self.path, self.ladder = "/wd", LadderConfig(group_window=0.05, victim_hold=0.01)
        self.released: list[int] = []
        self.finished: list[tuple[int, Any]] = []
        self.reported: list[Any] = []

    def finish(self, w: Any, info: Any, **kw: Any) -> None:
        self.finished.append((w.ref.pid, kw.get("role")))

    def release(self, w: Any) -> None:
        self.released.append(w.ref.pid)

    def report(self, ev: Any) -> None:
        self.reported.append(ev)


def _batch_worker(pid: int, armed: dict[int, float]) -> Any:
    return SimpleNamespace(key=(pid, 1), ref=SimpleNamespace(pid=pid), table=_Table(armed), identity=Identity())


def test_a_batch_whose_members_all_left_their_region_kills_nobody(caplog: pytest.LogCaptureFixture) -> None:
    from distinit.watchdog._batch import run_batch

    host = _Host()
    a, b = _batch_worker(1, {}), _batch_worker(2, {})  # both disarmed by the time the batch looks
    run_batch(host, [(a, 3, 0.0), (b, None, 0.01)], 0.0)  # type: ignore[arg-type]
    assert (host.released, host.finished, host.reported) == ([1, 2], [], [])
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # a normal outcome, not a failure


def test_a_batch_left_with_one_expired_member_takes_the_lone_path() -> None:
    import time

    from distinit.watchdog._batch import run_batch

    host = _Host()
    past = time.monotonic() - 1.0
    hung, healthy = _batch_worker(1, {3: past}), _batch_worker(2, {})
    run_batch(host, [(hung, 3, past), (healthy, None, time.monotonic())], past)  # type: ignore[arg-type]
    assert host.released == [2]
    assert host.finished == [(1, None)]  # no role, no verdict: judged alone
    assert host.reported == []


def test_a_false_rank_claim_is_noted_in_the_verdict_without_changing_it() -> None:
    liar = Member(
        pid=1000,
        identity=Identity(rank=1, local_rank=1, world_size=2),
        armed_at=1.0,
        finding=Finding("own_code", "train.py:9 in nccl_allreduce_wait"),
        mismatch=Identity(rank=1, local_rank=1, world_size=2).disagreement(1000, Identity(rank=0, local_rank=1)),
    )
    victim = _member(1, "collective", 1.1, world=2)
    verdict = judge([victim, liar], hold=1.0)
    assert verdict.likely == liar
    assert verdict.summary.endswith(
        "; rank check: pid 1000 registered as RANK 1 but its environment says 0 (/proc/1000/environ)"
    )


@pytest.mark.parametrize(
    ("environ", "note"),
    [
        pytest.param(None, "", id="environ-unreadable"),
        pytest.param(Identity(), "", id="no-rank-at-exec"),  # exported later: not a disagreement
        pytest.param(Identity(rank=3, local_rank=1, world_size=4), "", id="agrees"),
        pytest.param(Identity(rank=2, world_size=8), "RANK 3 but its environment says 2, WORLD_SIZE 4 but", id="two"),
    ],
)
def test_rank_disagreement(environ: Identity | None, note: str) -> None:
    found = Identity(rank=3, local_rank=1, world_size=4).disagreement(77, environ)
    assert (note in found) if note else found == ""


def test_the_environment_is_read_from_proc() -> None:
    import os

    assert isinstance(Identity.from_proc(os.getpid()), Identity)  # this process's environment at exec
    assert Identity.from_proc(2**22 + 1) is None  # no such process


def test_without_any_stack_no_culprit_and_no_victim_is_named() -> None:
    # A wrong name is worse than none: with no stack, nobody is said to run its own code or to wait.
    members = [
        Member(
            pid=1000 + r,
            identity=Identity(rank=r, world_size=2),
            armed_at=1.0,
            finding=Finding("unknown"),
            no_stack="no handler for the dump signal",
        )
        for r in (0, 1)
    ]
    verdict = judge(members, hold=1.0)
    assert verdict.culprits == () and verdict.likely is None
    assert "none with a readable stack (no handler for the dump signal)" in verdict.summary
    assert "no single culprit is named" in verdict.summary
    assert "blocked" not in verdict.summary and "own code" not in verdict.summary
    assert role_and_note(verdict, members[0], 1.0) == (
        None,
        "role unknown (no readable stack: no handler for the dump signal); no culprit named, killed with the others:",
    )


def test_a_victim_without_a_stack_is_not_said_to_be_blocked() -> None:
    culprit = _member(1, "own_code", 1.0, world=2)
    unread = Member(pid=1000, identity=Identity(rank=0, world_size=2), armed_at=1.0, finding=Finding("unknown"))
    verdict = judge([unread, culprit], hold=1.0)
    assert verdict.likely is culprit
    assert "victims RANK 0 (pid 1000) with no readable stack; killing the culprit first" in verdict.summary
    assert "blocked" not in verdict.summary


def test_assess_reads_a_single_thread_dump_and_names_what_is_missing() -> None:
    one = assess(7, Identity(rank=1), armed_at=2.0, stack=REAL_CULPRIT, thread=None)
    assert (one.finding.activity, one.no_stack) == ("own_code", "")
    two_threads = REAL_CULPRIT + REAL_VICTIM.replace("Current thread", "Thread")
    unknown = assess(7, Identity(), armed_at=2.0, stack=two_threads, thread=None)
    assert unknown.finding.activity == "unknown"
    assert unknown.no_stack == "the dump shows several threads and nothing says which one armed the region"
    assert assess(7, Identity(), armed_at=2.0, stack=two_threads, thread=0x99).no_stack.startswith(
        "the dump shows no frames of thread 0x99"
    )
    gone = assess(7, Identity(), armed_at=2.0, stack=None, thread=None, no_stack="the worker had exited")
    assert (gone.finding.activity, gone.no_stack) == ("unknown", "the worker had exited")
