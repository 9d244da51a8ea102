"""Guarded waits: poll a check at an interval until it says stop or a bound passes, while a blocking call runs.

torch's store and rendezvous calls block in native code that no Python-level bound can interrupt (a store
host that stops answering while its TCP connection stays up blocks a read for many minutes). Two packages
therefore run such a call in a daemon thread and wait for it themselves, watching for a verdict reached
elsewhere meanwhile: init's rendezvous thread (:func:`distinit.init._thread.run_guarded`, which adds the
hand-over: the thread claims the formed group, or the caller abandons it) and the torchrun handler's join
(:mod:`distinit.rendezvous._handler`, which reads the other agents' cards while torch's join blocks). Both
wait the same way, here:

* :class:`Call` -- a callable run in a named daemon thread; what it returned or raised is kept for the
  caller's thread (:meth:`Call.result` returns or re-raises it), and :attr:`Call.finished` is set when it ends.
* :func:`wait_guarded` -- start a call and wait for it in slices of ``every`` seconds, asking ``check()``
  after each slice; how the wait ended is returned, never raised (:data:`Waited`): the call ended, the
  check gave a reason to stop, the bound passed, or the caller's own wait was interrupted (Ctrl-C). The
  caller decides what each means; a call still blocked is left running (daemon: it cannot be stopped).
* :func:`poll_until` -- the same wait without a thread: re-check a condition every ``every`` seconds until
  it holds or a bound passes (the store reads of the torchrun handler).

The caller waits on :attr:`Call.finished`, never with ``Thread.join(timeout)``: on CPython 3.11 (seen on
3.11.7) a ``KeyboardInterrupt`` that interrupts ``join`` marks a thread that still runs as stopped (the
bpo-45274 handler in ``Thread._wait_for_tstate_lock`` releases the lock the running thread holds), so
``is_alive()`` says False from then on and a later ``join()`` returns at once: an interrupted rendezvous
would look wound down while it still runs. An interrupted ``Event.wait`` leaves the thread's state alone.

A top-level leaf: the standard library and :mod:`distinit._duration` only.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from distinit._duration import wait_bound

__all__ = ["Call", "Ended", "Interrupted", "OutOfTime", "Stopped", "Waited", "poll_until", "wait_guarded"]

T = TypeVar("T")
R = TypeVar("R")


class Call(Generic[T]):
    """``fn()`` to run in a daemon thread named ``name``; its result is handed to the caller's thread.

    The thread is built, not started (:func:`wait_guarded` starts it inside its guard, so a Ctrl-C that
    lands during :meth:`start` is seen like any other). :attr:`finished` is set once ``fn`` returned or
    raised (the thread itself ends a moment later).
    """

    def __init__(self, fn: Callable[[], T], *, name: str) -> None:
        self._fn = fn
        self._returned: tuple[T] | None = None
        self._raised: BaseException | None = None
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self._returned = (self._fn(),)
        except BaseException as exc:  # handed to the caller's thread by result()
            self._raised = exc
        finally:
            self.finished.set()

    def start(self) -> None:
        """Start the thread (once)."""
        self.thread.start()

    @property
    def ended(self) -> bool:
        """Whether ``fn`` returned or raised (False while it runs, and before it started)."""
        return self.finished.is_set()

    def result(self) -> T:
        """What ``fn()`` returned; what it raised is raised here, in the caller's thread.

        Raises:
            RuntimeError: the call has not ended (still running, or never started): a caller's mistake.
        """
        if self._raised is not None:
            raise self._raised
        if self._returned is None:
            state = "is still running" if self.thread.ident is not None else "has not run"
            raise RuntimeError(f"the call in thread {self.thread.name!r} {state}: it has no result yet")
        return self._returned[0]


@dataclass(frozen=True)
class Ended:
    """The call ended within the wait (what it returned or raised, the caller reads: :meth:`Call.result`)."""


@dataclass(frozen=True)
class Stopped(Generic[R]):
    """``check()`` returned ``reason`` (not None): the wait stopped early.

    The check runs after every slice, the one in which the call ended too, so a reason found at that very
    moment is not lost: :attr:`Call.ended` says whether the call still runs.
    """

    reason: R


@dataclass(frozen=True)
class OutOfTime:
    """The bound passed while the call still ran (it runs on: a blocking native call cannot be stopped)."""


@dataclass(frozen=True)
class Interrupted:
    """The caller's wait raised ``error``: Ctrl-C (``KeyboardInterrupt``) or what ``check()`` raised.

    The call may still run, or may never have started (interrupted inside :meth:`Call.start`).
    """

    error: BaseException


#: How :func:`wait_guarded` ended (one of four small values; ``Stopped`` carries the check's reason).
Waited = Ended | Stopped[R] | OutOfTime | Interrupted


def _seconds(every: float | Callable[[], float]) -> float:
    return every() if callable(every) else every


def wait_guarded(
    call: Call[T],
    *,
    check: Callable[[], R | None],
    every: float | Callable[[], float],
    until: float = math.inf,
) -> Waited[R]:
    """Start ``call`` and wait for it: in slices of ``every`` s, until the monotonic ``until``.

    After each slice ``check()`` is asked; a value other than None stops the wait (:class:`Stopped`).
    ``every`` may be a callable (read before each slice: an interval that grows with the work the check
    does). A slice never outlasts ``until``, and a native wait never overflows (``inf`` is no bound). Never
    raises: what interrupted the wait, :meth:`Call.start` included, is returned as :class:`Interrupted`.
    """
    try:
        # Started inside the try: a Ctrl-C that lands while start() waits for the thread to run (the body may
        # already be under way, on a loaded machine) is an interruption like any other, not an escape.
        call.start()
        while not call.ended and (left := until - time.monotonic()) > 0:
            call.finished.wait(wait_bound(min(left, _seconds(every))))
            reason = check()
            if reason is not None:
                return Stopped(reason)
    except BaseException as exc:  # handed to the caller, who undoes what it must and raises it
        return Interrupted(exc)
    return Ended() if call.ended else OutOfTime()


def poll_until(done: Callable[[], bool], *, every: float, until: float) -> bool:
    """Ask ``done()`` now and every ``every`` s until it says True (True) or the monotonic ``until`` passes (False).

    The last pause is cut to what is left and ``done()`` is asked once more at the bound, so a condition
    that holds by then is seen and the bound is not overshot by a pause (a ``done()`` that blocks may
    overshoot it: bound its own calls). What ``done()`` raises propagates.
    """
    while not done():
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(wait_bound(min(every, left)))
    return True
