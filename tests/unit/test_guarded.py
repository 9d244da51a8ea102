"""The guarded wait's decisions (distinit._guarded): ended, stopped by the check, out of time, interrupted.

Threads only: no process, no store, no network. Every wait is bounded by an event the test sets.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from distinit._guarded import Call, Ended, Interrupted, OutOfTime, Stopped, poll_until, wait_guarded


def _never() -> None:
    return None


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: a body blocked on it ends, so no thread outlives its test."""
    event = threading.Event()
    yield event
    event.set()


@pytest.mark.timeout(10)
def test_a_call_that_returns_hands_its_value_to_the_caller() -> None:
    call = Call(lambda: threading.current_thread().name, name="distinit-test-call")
    waited = wait_guarded(call, check=_never, every=0.05)
    assert waited == Ended()
    assert call.result() == "distinit-test-call"  # ran in the named thread, returned in this one
    assert call.thread.daemon


@pytest.mark.timeout(10)
def test_what_the_call_raised_is_raised_in_the_callers_thread() -> None:
    def fail() -> None:
        raise ValueError("the store said no")

    call = Call(fail, name="t")
    assert wait_guarded(call, check=_never, every=0.05) == Ended()  # the wait itself never raises it
    with pytest.raises(ValueError, match="the store said no"):
        call.result()


def test_a_result_asked_for_before_the_call_ran_is_a_callers_mistake() -> None:
    call = Call(lambda: 1, name="t")
    with pytest.raises(RuntimeError, match="has not run"):
        call.result()


@pytest.mark.timeout(10)
def test_the_check_stops_the_wait_early_and_the_thread_runs_on(release: threading.Event) -> None:
    call = Call(lambda: release.wait(10), name="t")
    asked: list[float] = []

    def check() -> str | None:
        asked.append(time.monotonic())
        return "a peer's verdict" if len(asked) == 3 else None

    started = time.monotonic()
    waited = wait_guarded(call, check=check, every=0.05)
    assert waited == Stopped("a peer's verdict")
    assert len(asked) == 3 and time.monotonic() - started < 5
    assert not call.ended and call.thread.is_alive()  # left running: the caller decides what that means


@pytest.mark.timeout(10)
def test_the_interval_may_be_read_before_every_slice(release: threading.Event) -> None:
    intervals = iter([0.01, 0.02, 0.03])
    read: list[float] = []

    def every() -> float:
        read.append(next(intervals))
        return read[-1]

    waited = wait_guarded(Call(lambda: release.wait(10), name="t"), check=lambda: len(read) == 3 or None, every=every)
    assert waited == Stopped(True) and read == [0.01, 0.02, 0.03]


@pytest.mark.timeout(10)
def test_the_bound_ends_the_wait_while_the_thread_is_still_blocked(release: threading.Event) -> None:
    call = Call(lambda: release.wait(10), name="t")
    started = time.monotonic()
    waited = wait_guarded(call, check=_never, every=5.0, until=started + 0.2)  # a slice never outlasts it
    assert waited == OutOfTime()
    assert 0.2 <= time.monotonic() - started < 3
    assert not call.ended and call.thread.is_alive()
    with pytest.raises(RuntimeError, match="still running"):
        call.result()


@pytest.mark.timeout(10)
def test_a_check_that_finds_a_reason_as_the_call_ends_is_not_lost() -> None:
    # The check runs after the slice in which the call ended too: a verdict seen at that moment is reported.
    release = threading.Event()
    call = Call(lambda: release.wait(10), name="t")

    def every() -> float:
        release.set()  # read just before the first slice: the call ends within it
        return 5.0

    waited = wait_guarded(call, check=lambda: "verdict", every=every)
    assert waited == Stopped("verdict") and call.ended and call.result() is True


@pytest.mark.timeout(10)
def test_ctrl_c_in_the_callers_wait_is_returned_not_raised(release: threading.Event) -> None:
    # The caller's wait is interrupted as Ctrl-C would: a signal handler raising in the main thread (SIGUSR1,
    # not SIGALRM, which pytest-timeout may use).
    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    call = Call(lambda: release.wait(10), name="t")
    previous = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        waited = wait_guarded(call, check=_never, every=0.05, until=time.monotonic() + 30)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert isinstance(waited, Interrupted) and isinstance(waited.error, KeyboardInterrupt)
    # Still running, and seen so: an interrupted Thread.join() would have marked the thread stopped (CPython 3.11).
    assert not call.ended and call.thread.is_alive()
    release.set()
    call.thread.join(5)
    assert call.result() is True


class _InterruptedStart(Call[bool]):
    """A call whose start() is interrupted just as it returns: Ctrl-C while the caller waits for it to run."""

    def start(self) -> None:
        super().start()
        raise KeyboardInterrupt


@pytest.mark.timeout(10)
def test_ctrl_c_inside_start_is_an_interruption_too(release: threading.Event) -> None:
    call = _InterruptedStart(lambda: release.wait(10), name="t")
    waited = wait_guarded(call, check=_never, every=0.05)
    assert isinstance(waited, Interrupted) and isinstance(waited.error, KeyboardInterrupt)


@pytest.mark.timeout(10)
def test_what_the_check_raises_is_returned_as_an_interruption(release: threading.Event) -> None:
    def check() -> None:
        raise RuntimeError("the cards could not be read")

    waited = wait_guarded(Call(lambda: release.wait(10), name="t"), check=check, every=0.01)
    assert isinstance(waited, Interrupted) and str(waited.error) == "the cards could not be read"


@pytest.mark.timeout(10)
def test_no_bound_and_no_overflow_with_an_infinite_interval() -> None:
    # Thread.join(inf) would raise OverflowError: the slice is clamped for the native wait.
    call = Call(lambda: 7, name="t")
    assert wait_guarded(call, check=_never, every=float("inf")) == Ended()
    assert call.result() == 7


@pytest.mark.timeout(10)
def test_poll_until_returns_once_the_condition_holds() -> None:
    answers = iter([False, False, True])
    assert poll_until(lambda: next(answers), every=0.01, until=time.monotonic() + 5) is True


@pytest.mark.timeout(10)
def test_poll_until_asks_once_more_at_the_bound_and_never_pauses_past_it() -> None:
    asked: list[float] = []

    def done() -> bool:
        asked.append(time.monotonic())
        return False

    started = time.monotonic()
    assert poll_until(done, every=5.0, until=started + 0.2) is False
    assert len(asked) == 2 and asked[1] >= started + 0.2  # now, and at the bound (the 5 s pause was cut)
    assert time.monotonic() - started < 3


def test_poll_until_asks_at_least_once_even_past_the_bound() -> None:
    assert poll_until(lambda: True, every=1.0, until=time.monotonic() - 1) is True
    asked: list[int] = []
    assert poll_until(lambda: asked.append(1) is not None, every=1.0, until=time.monotonic() - 1) is False
    assert asked == [1]
