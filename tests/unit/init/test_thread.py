"""The hand-over between the rendezvous thread and its caller, the leftover check, and one flight per process.

Threads only: no process group, no store, no network.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from distinit._guarded import Call
from distinit.errors import DuplicateRankError, RendezvousError
from distinit.init import _thread
from distinit.init._thread import Abandoned, Handover, SingleFlight, check_no_leftover, leave_behind, run_guarded


@pytest.fixture(autouse=True)
def _no_leftover() -> Iterator[None]:
    yield
    _thread.PROCESS.leftover = None


def test_claim_and_abandon_exclude_each_other() -> None:
    first = Handover()
    assert first.claim() is True
    assert first.abandon() is False  # too late: the thread owns the group
    first.check()  # not abandoned: no raise

    second = Handover()
    assert second.abandon() is True
    assert second.claim() is False  # the caller gave up first: the thread must destroy its group
    with pytest.raises(Abandoned):
        second.check()


@pytest.mark.timeout(10)
def test_sleep_wakes_at_once_when_abandoned_and_never_overflows() -> None:
    handover = Handover()
    threading.Timer(0.2, handover.abandon).start()
    started = time.monotonic()
    with pytest.raises(Abandoned):
        handover.sleep(float("inf"))  # clamped for the native wait: no OverflowError
    assert time.monotonic() - started < 5


def _daemon(body: Callable[[], object]) -> threading.Thread:
    return threading.Thread(target=body, name="t", daemon=True)


def _call(body: Callable[[], object]) -> Call[None]:
    def run() -> None:
        body()

    return Call(run, name="t")


@pytest.mark.timeout(10)
def test_run_guarded_waits_for_the_thread_to_end() -> None:
    ended = threading.Event()
    outcome = run_guarded(
        _call(ended.set),
        deadline_at=float("inf"),  # Thread.join(inf) would raise OverflowError
        handover=Handover(),
    )
    assert outcome.kind == "done" and outcome.error is None and ended.is_set()


@pytest.mark.timeout(10)
def test_run_guarded_abandons_a_body_blocked_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_thread, "OVERRUN_GRACE", 0.2)
    release = threading.Event()
    handover = Handover()
    started = time.monotonic()
    outcome = run_guarded(_call(lambda: release.wait(10)), deadline_at=time.monotonic() + 0.1, handover=handover)
    assert time.monotonic() - started < 0.1 + _thread.OVERRUN_GRACE + 2
    assert outcome.kind == "overrun" and outcome.error is None
    assert handover.abandoned and outcome.thread.is_alive()
    release.set()


@pytest.mark.timeout(10)
def test_an_interrupted_wait_abandons_the_rendezvous_before_it_propagates() -> None:
    handover = Handover()

    def body() -> None:
        with contextlib.suppress(Abandoned):
            while True:
                handover.sleep(0.05)  # raises Abandoned once the caller gave up

    # The caller's wait is interrupted as Ctrl-C would: a signal handler raising in the main thread (SIGUSR1,
    # not SIGALRM, which pytest-timeout may use).
    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        outcome = run_guarded(_call(body), deadline_at=time.monotonic() + 30, handover=handover)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert outcome.kind == "interrupted" and isinstance(outcome.error, KeyboardInterrupt)
    assert outcome.formed is False and handover.abandoned
    assert handover.claim() is False  # a group formed now would never be handed over
    # Still running, and seen so: the caller's wait was never an interrupted Thread.join(), which on CPython 3.11
    # marks a running thread stopped (a leftover would then look wound down while it still runs).
    assert outcome.thread.is_alive()
    leave_behind(outcome.thread, "interrupted", stuck=False)
    check_no_leftover(0, patience=5)  # waits for it to wind down at its next check
    assert not outcome.thread.is_alive()


class _InterruptedStart(Call[None]):
    """A call whose start() is interrupted just as it returns: Ctrl-C while the caller waits for it to run."""

    def start(self) -> None:
        super().start()
        raise KeyboardInterrupt


@pytest.mark.timeout(10)
def test_a_ctrl_c_inside_the_threads_start_abandons_the_rendezvous_too() -> None:
    handover = Handover()
    wound_down = threading.Event()

    def body() -> None:
        try:
            while True:
                handover.sleep(0.05)
        except Abandoned:
            wound_down.set()

    call = _InterruptedStart(body, name="t")
    outcome = run_guarded(call, deadline_at=time.monotonic() + 30, handover=handover)
    assert outcome.kind == "interrupted" and isinstance(outcome.error, KeyboardInterrupt)
    assert handover.abandoned and wound_down.wait(5)  # not running on behind the caller's back
    leave_behind(call.thread, "interrupted in start()", stuck=False)
    check_no_leftover(0, patience=5)  # wound down: the next rendezvous may start


@pytest.mark.timeout(10)
def test_a_leftover_that_never_started_is_no_leftover() -> None:
    leave_behind(_daemon(lambda: None), "interrupted before it ran", stuck=False)
    check_no_leftover(0, patience=5)  # no RuntimeError from joining a thread that never started
    assert _thread.PROCESS.leftover is None


@pytest.mark.timeout(10)
def test_leftover_interrupted_thread_is_waited_for_and_a_stuck_one_refused_at_once() -> None:
    done = threading.Event()
    winding = threading.Thread(target=lambda: done.wait(0.3))
    winding.start()
    leave_behind(winding, "interrupted, attempt 1 waiting in join", stuck=False)
    check_no_leftover(0, patience=5)  # waits for it to wind down, then allows the new call
    assert _thread.PROCESS.leftover is None

    stuck_release = threading.Event()
    stuck = threading.Thread(target=lambda: stuck_release.wait(10))
    stuck.start()
    leave_behind(stuck, "attempt 1 blocked in join for 10.0 s", stuck=True)
    started = time.monotonic()
    with pytest.raises(RendezvousError, match="still blocked"):
        check_no_leftover(1, patience=5)
    assert time.monotonic() - started < 1  # no waiting for a thread that may never return
    stuck_release.set()
    stuck.join(5)


def _led(flight: SingleFlight, call: Callable[[], object], *, patience: float = 10) -> object:
    with flight.lead(what="init_with_retry()", rank=0, patience=patience):
        return call()


@pytest.mark.timeout(20)
def test_concurrent_callers_share_one_flight_and_its_result() -> None:
    flight = SingleFlight()
    entered = threading.Event()
    release = threading.Event()
    runs: list[str] = []
    formed: list[str] = []

    def call() -> str:
        if formed:  # the second run finds the group formed, as init_with_retry's existing-group check does
            runs.append("existing")
            return "existing"
        entered.set()
        release.wait(10)
        runs.append("rendezvous")
        formed.append("group")
        return "formed"

    results: dict[str, object] = {}
    leader = threading.Thread(target=lambda: results.update(leader=_led(flight, call)))
    leader.start()
    entered.wait(5)
    follower = threading.Thread(target=lambda: results.update(follower=_led(flight, call)))
    follower.start()
    time.sleep(0.2)
    assert runs == []  # the follower waits instead of starting a second rendezvous
    release.set()
    leader.join(5)
    follower.join(5)
    assert results == {"leader": "formed", "follower": "existing"}
    assert runs == ["rendezvous", "existing"]


@pytest.mark.timeout(20)
def test_a_concurrent_caller_gets_the_leaders_error_at_once() -> None:
    flight = SingleFlight()
    entered = threading.Event()

    def failing() -> None:
        entered.set()
        time.sleep(0.3)
        raise DuplicateRankError("rank 1 was claimed twice", ranks=(1,))

    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            with flight.lead(what="setup()", rank=1, patience=10):
                failing()
        except BaseException as exc:
            errors[name] = exc

    leader = threading.Thread(target=run, args=("leader",))
    leader.start()
    entered.wait(5)
    follower = threading.Thread(target=run, args=("follower",))
    follower.start()
    leader.join(5)
    follower.join(5)
    assert type(errors["follower"]) is DuplicateRankError
    assert errors["follower"] is not errors["leader"] and errors["follower"].__cause__ is errors["leader"]
    assert str(errors["follower"]) == str(errors["leader"]) and errors["follower"].ranks == (1,)  # type: ignore[attr-defined]


@pytest.mark.timeout(20)
def test_a_concurrent_caller_does_not_wait_past_its_own_patience() -> None:
    flight = SingleFlight()
    entered, release = threading.Event(), threading.Event()

    def slow() -> None:
        entered.set()
        release.wait(10)

    leader = threading.Thread(target=_led, args=(flight, slow))
    leader.start()
    entered.wait(5)
    started = time.monotonic()
    with pytest.raises(RendezvousError, match="still running"):
        _led(flight, slow, patience=0.3)
    assert time.monotonic() - started < 3
    release.set()
    leader.join(5)
