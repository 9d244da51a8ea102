"""The thread that runs a rendezvous, the hand-over with its caller, and what is process-wide.

torch's TCPStore client reads replies without a timeout (only ``wait`` has one), and gloo's bootstrap reads
through it: a store host that stops answering while its TCP connection stays up (frozen, SIGSTOPped,
swapped out, behind a lossy link) blocks such a read for as long as TCP keeps retrying, which is many
minutes. No Python-level bound can interrupt it, so the attempts run in a daemon thread that the caller
waits for with a bound, and the caller gives the rendezvous up (abandons it):

* at the deadline: the thread is still blocked :data:`OVERRUN_GRACE` seconds past it;
* when the caller's wait is interrupted: Ctrl-C (``KeyboardInterrupt``) or any other ``BaseException``.

An abandoned rendezvous never hands a group to anyone: the thread claims the formed group through
:meth:`Handover.claim`, which fails once the caller gave up (the thread then destroys the group), and it
winds down at its next check (:meth:`Handover.check`, at most about a second apart while it waits or
pauses), dropping its store. While it still runs, the process's next rendezvous must not race it
(:func:`check_no_leftover`).

The wait itself (start the thread inside the guard, join it in slices, read the early verdict after each,
stop at the bound, catch the caller's interruption) is the shared leaf :func:`distinit._guarded.wait_guarded`,
which the torchrun handler's join uses too; what is init's is the hand-over on top of it. The rendezvous
thread's end is returned to the caller as an :class:`Outcome` (done, overrun, a peer's verdict,
interrupted): the leaf's answer once :meth:`Handover.abandon` has decided it (a thread that claimed a formed
group is never abandoned: it is ``done``); the caller decides what each means.

One rendezvous is in flight per process at a time (:class:`SingleFlight`): a concurrent caller waits for it
and shares its outcome. Whatever must be process-wide lives in one object, :data:`PROCESS`, with
:meth:`Process.reset` for tests.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from distinit._duration import wait_bound
from distinit._guarded import Call, Interrupted, OutOfTime, Stopped, wait_guarded
from distinit.errors import DistinitError, RendezvousError
from distinit.init._policy import quote

#: Seconds past the deadline that the caller waits for a rendezvous thread stuck in a native call before
#: it raises anyway (torch's store client has no receive timeout: a frozen store host blocks it forever).
OVERRUN_GRACE = 2.0
#: How often the caller asks for an early verdict while the rendezvous thread runs.
EARLY_POLL = 0.25


class Abandoned(Exception):
    """Raised inside the rendezvous thread once its caller gave up: wind down, install nothing."""


class Handover:
    """The one decision between the thread and the caller: the thread formed the group, or the caller gave up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._formed = False
        self._abandoned = threading.Event()
        #: Set once the caller gave up (for waits that poll the store: they end at once).
        self.gave_up = self._abandoned

    def abandon(self) -> bool:
        """Give the rendezvous up (caller side). False: too late, the thread already claimed a formed group."""
        with self._lock:
            if self._formed:
                return False
            self._abandoned.set()
            return True

    def claim(self) -> bool:
        """Claim the formed group (thread side). False: the caller gave up first; destroy the group."""
        with self._lock:
            if self._abandoned.is_set():
                return False
            self._formed = True
            return True

    @property
    def abandoned(self) -> bool:
        """Whether the caller gave up."""
        return self._abandoned.is_set()

    def check(self) -> None:
        """Raise :class:`Abandoned` if the caller gave up (thread side, between blocking calls)."""
        if self._abandoned.is_set():
            raise Abandoned

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (clamped for a native wait); raise :class:`Abandoned` at once if the caller gives up."""
        if self._abandoned.wait(wait_bound(seconds)):
            raise Abandoned


class Early(Protocol):
    """Where a verdict reached elsewhere appears while the rendezvous thread runs (an attribute, polled)."""

    @property
    def verdict(self) -> BaseException | None:  # the verdict, or None
        ...


@dataclass
class Outcome:
    """How the rendezvous thread ended, as the caller saw it.

    ``done``: the thread ended (what it raised, it keeps itself); ``overrun``: still blocked
    :data:`OVERRUN_GRACE` s past the deadline (the rendezvous is abandoned); ``verdict``: a peer's verdict
    (``error``) arrived while the thread was blocked in a native call (abandoned); ``interrupted``: the
    caller's wait was interrupted (``error``: the interruption; ``formed``: the group formed at that very
    moment, so the caller must undo it; otherwise the rendezvous is abandoned).
    """

    kind: Literal["done", "overrun", "verdict", "interrupted"]
    thread: threading.Thread
    error: BaseException | None = None
    formed: bool = False


def run_guarded(
    call: Call[None],
    *,
    deadline_at: float,
    handover: Handover,
    early: Early | None = None,
) -> Outcome:
    """Start ``call`` (one rendezvous, in a daemon thread); wait until :data:`OVERRUN_GRACE` past ``deadline_at``.

    The wait is the shared leaf's (:func:`distinit._guarded.wait_guarded`); what is init's is the hand-over:
    the rendezvous is abandoned only through :meth:`Handover.abandon`, which fails once the thread claimed a
    formed group (then the caller waits for its bookkeeping and gets ``done``). The body keeps what it raised
    itself (the caller reads it on ``done``; an abandoned body drops it, with the store its frames hold, so
    it returns None and the call's result box stays empty). ``early.verdict`` is read every :data:`EARLY_POLL`
    s: a verdict a peer reached while the thread is blocked in a native call (see
    :class:`distinit.init._form.InitWatch`). Never raises: see :class:`Outcome`.
    """
    thread = call.thread
    waited = wait_guarded(
        call,
        check=lambda: early.verdict if early is not None else None,
        every=EARLY_POLL,
        until=deadline_at + OVERRUN_GRACE,
    )
    if isinstance(waited, Interrupted):  # Ctrl-C: handed to the caller, who undoes what it must and raises it
        return Outcome("interrupted", thread, waited.error, formed=not handover.abandon())
    if isinstance(waited, Stopped) and not call.ended and handover.abandon():
        return Outcome("verdict", thread, waited.reason)
    if isinstance(waited, OutOfTime) and not call.ended and handover.abandon():
        return Outcome("overrun", thread)
    thread.join()  # ended, or formed just now (only the bookkeeping is left)
    return Outcome("done", thread)


@dataclass(frozen=True)
class Leftover:
    """An abandoned rendezvous thread of this process: what it is blocked in, and whether it can end soon.

    ``stuck``: abandoned at the deadline while blocked in a native call (it may never return); otherwise
    it was interrupted and winds down at its next check.
    """

    thread: threading.Thread
    what: str
    stuck: bool


@dataclass
class Process:
    """What is process-wide, in one place (see the module docstring).

    ``leftover``: an abandoned rendezvous thread still running; ``calls``/``resume``: the rendezvous calls'
    numbering (the k-th call of each rank meets the k-th call of the others, in a store namespace of its
    own; an interrupted call gives its number back: for the peers it never happened); ``setup``,
    ``liveness``, ``atexit_registered``: what :func:`distinit.setup` did, undone by ``teardown()``.
    """

    leftover: Leftover | None = None
    calls: int = 0
    resume: bool = False
    setup: Any = None  # the SetupResult of the setup() in force
    liveness: Any = None  # its Liveness watch
    atexit_registered: bool = False
    flight: SingleFlight = field(default_factory=lambda: SingleFlight())

    def take_call(self) -> tuple[int, bool]:
        """This call's number, and whether it resumes the namespace of an interrupted call."""
        if self.resume:
            self.resume = False
            return self.calls, True
        self.calls += 1
        return self.calls, False

    def reset(self) -> None:
        """Forget everything (tests only: a real process never needs it)."""
        fresh = Process()
        self.__dict__.update(fresh.__dict__)


def leave_behind(thread: threading.Thread, what: str, *, stuck: bool) -> None:
    """Record an abandoned rendezvous thread, so that the next rendezvous does not race it."""
    PROCESS.leftover = Leftover(thread=thread, what=what, stuck=stuck)


def check_no_leftover(rank: int, *, patience: float) -> None:
    """Refuse a new rendezvous while an abandoned one of this process still runs.

    An interrupted one winds down within about a second of its next check: wait up to ``patience``
    seconds for it. One stuck in a native call may never return: refuse at once.

    Raises:
        RendezvousError: the abandoned rendezvous still runs.
    """
    left = PROCESS.leftover
    if left is None:
        return
    if not left.stuck and left.thread.is_alive():  # (never started: interrupted inside start())
        left.thread.join(wait_bound(patience))
    if not left.thread.is_alive():
        PROCESS.leftover = None
        return
    why = (
        "the earlier init_with_retry() raised RendezvousTimeoutError while a store or network call was stuck "
        "in native code, which nothing can interrupt."
        if left.stuck
        else f"the earlier call was interrupted and its thread did not wind down within {patience:.0f} s."
    )
    raise RendezvousError(
        f"rank {rank}: an earlier rendezvous of this process is still blocked ({left.what}); a new one would race it",
        rank=rank,
        why=why,
        fix="exit and restart the process (let the launcher restart it) instead of retrying in it.",
    )


class _Flight:
    """One call in progress: who runs it, and how it ended."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.owner = threading.current_thread()
        self.done = threading.Event()
        self.error: BaseException | None = None


class SingleFlight:
    """Run one call at a time per process; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: _Flight | None = None

    @contextlib.contextmanager
    def lead(self, *, what: str, rank: int | None, patience: float) -> Iterator[None]:
        """Lead the one call in flight for the ``with`` block, after waiting up to ``patience`` s for another.

        A call already in flight is followed: its error is raised here; once it succeeded, this call leads
        its own (which finds the group formed and returns at once).

        Raises:
            RendezvousError: the call in flight did not end within ``patience``, or it failed in a way that
                is not a distinit error (an interruption, a bad argument of that caller).
            DistinitError: a copy of the error of the call in flight.
        """
        while True:
            with self._lock:
                flight = self._current
                if flight is None:
                    flight = self._current = _Flight(what)
                    break
            self._follow(flight, rank=rank, patience=patience)
        try:
            yield
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                self._current = None
            flight.done.set()

    def _follow(self, flight: _Flight, *, rank: int | None, patience: float) -> None:
        """Wait for the call in flight; return when it succeeded (the caller then runs its own call)."""
        who = "this process" if rank is None else f"rank {rank}"
        if not flight.done.wait(wait_bound(patience)):
            raise RendezvousError(
                f"{who}: {flight.what} in thread {flight.owner.name!r} of this process was still running "
                f"after this call's deadline ({patience:.0f} s).",
                rank=rank,
                why="two threads of one process started the rendezvous at once; it runs once per process.",
                fix="call it from one thread only (others can wait for it), or give this call a longer deadline.",
            )
        error = flight.error
        if error is None:
            return
        if isinstance(error, DistinitError):
            raise copy.copy(error) from error  # the same verdict, with this thread's traceback
        raise RendezvousError(
            f"{who}: {flight.what} in thread {flight.owner.name!r} of this process, which this call waited for, "
            f"failed: {quote(error)}",
            rank=rank,
            why="two threads of one process started the rendezvous at once; the one that ran it failed.",
            fix="see that thread's error; call the rendezvous from one thread only.",
        ) from error


#: The one process state.
PROCESS = Process()
