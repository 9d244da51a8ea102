"""The hand-over between the rendezvous thread and its caller: who owns the outcome, and what is left behind.

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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from distinit._duration import wait_bound
from distinit.errors import RendezvousError

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


def run_guarded(
    body: Callable[[], None],
    *,
    name: str,
    deadline_at: float,
    handover: Handover,
    overrun: Callable[[threading.Thread], BaseException],
    interrupted: Callable[[threading.Thread, bool], None],
    early: Callable[[], BaseException | None] = lambda: None,
) -> None:
    """Run ``body`` in a daemon thread; wait for it until :data:`OVERRUN_GRACE` past ``deadline_at``.

    ``body``'s exception is raised here. If the thread is still blocked at the bound, the rendezvous is
    abandoned and ``overrun(thread)`` gives the error to raise. If the wait itself is interrupted, the
    rendezvous is abandoned, ``interrupted(thread, formed)`` runs (``formed``: the group formed at that very
    moment, so the caller must undo it) and the interruption propagates. ``early()`` is asked every
    :data:`EARLY_POLL` s: a verdict a peer reached while the thread is blocked in a native call (see
    :mod:`distinit.init._init_verdict`); it is raised at once and the blocked thread left behind.
    """
    outcome: list[BaseException] = []

    def capture() -> None:
        try:
            body()
        except BaseException as exc:  # handed to the caller below
            outcome.append(exc)

    thread = threading.Thread(target=capture, name=name, daemon=True)
    thread.start()
    end = deadline_at + OVERRUN_GRACE
    verdict: BaseException | None = None
    try:
        while thread.is_alive() and (verdict := early()) is None and (left := end - time.monotonic()) > 0:
            thread.join(wait_bound(min(left, EARLY_POLL)))
    except BaseException:
        interrupted(thread, not handover.abandon())
        raise
    if thread.is_alive() and verdict is not None and handover.abandon():
        leave_behind(thread, f"{name}: still in a native call after a peer's verdict", stuck=True)
        raise verdict
    if thread.is_alive():
        if not handover.abandon():
            thread.join()  # formed just now: only the bookkeeping is left
        elif not outcome:  # (else it ended on its own verdict just now: raise that one)
            raise overrun(thread)
    if outcome:
        raise outcome[0]


@dataclass(frozen=True)
class Leftover:
    """An abandoned rendezvous thread of this process: what it is blocked in, and whether it can end soon.

    ``stuck``: abandoned at the deadline while blocked in a native call (it may never return); otherwise
    it was interrupted and winds down at its next check.
    """

    thread: threading.Thread
    what: str
    stuck: bool


class _Process:
    """The process's abandoned rendezvous thread, if any."""

    leftover: Leftover | None = None


def leave_behind(thread: threading.Thread, what: str, *, stuck: bool) -> None:
    """Record an abandoned rendezvous thread, so that the next rendezvous does not race it."""
    _Process.leftover = Leftover(thread=thread, what=what, stuck=stuck)


def check_no_leftover(rank: int, *, patience: float) -> None:
    """Refuse a new rendezvous while an abandoned one of this process still runs.

    An interrupted one winds down within about a second of its next check: wait up to ``patience``
    seconds for it. One stuck in a native call may never return: refuse at once.

    Raises:
        RendezvousError: the abandoned rendezvous still runs.
    """
    left = _Process.leftover
    if left is None:
        return
    if not left.stuck:
        left.thread.join(wait_bound(patience))
    if not left.thread.is_alive():
        _Process.leftover = None
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
