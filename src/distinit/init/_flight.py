"""One rendezvous in flight per process: a concurrent caller waits for it and shares its outcome.

Two threads calling ``setup()`` (or ``init_with_retry()``) at once would otherwise run two rendezvous, and
the second, in a store namespace no peer uses, would wait its whole deadline and then blame ranks that
are present. Instead the first caller leads; the others wait for it, and then either run their own call
(which finds the group formed and returns at once) or raise the leader's error.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import TypeVar

from distinit._duration import wait_bound
from distinit.errors import DistinitError, RendezvousError
from distinit.init._attempt import quote

T = TypeVar("T")


class _Flight:
    """One call in progress: who runs it, and how it ended."""

    def __init__(self) -> None:
        self.owner = threading.current_thread()
        self.done = threading.Event()
        self.error: BaseException | None = None


class SingleFlight:
    """Run one call at a time per process; see the module docstring."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self._current: _Flight | None = None

    def run(self, call: Callable[[], T], *, rank: int | None, patience: float) -> T:
        """Run ``call`` alone, or wait up to ``patience`` seconds for the call in flight and follow it.

        Raises:
            RendezvousError: the call in flight did not end within ``patience``, or it failed in a way that
                is not a distinit error (an interruption, a bad argument of that caller).
            DistinitError: a copy of the error of the call in flight.
        """
        while True:
            with self._lock:
                flight = self._current
                lead = flight is None
                if flight is None:
                    flight = self._current = _Flight()
            if lead:
                return self._lead(flight, call)
            if flight.owner is threading.current_thread():
                return call()  # re-entered from the call in flight (setup() calls init_with_retry()): no wait
            self._follow(flight, rank=rank, patience=patience)

    def _lead(self, flight: _Flight, call: Callable[[], T]) -> T:
        try:
            return call()
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
                f"{who}: {self.what} in thread {flight.owner.name!r} of this process was still running "
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
            f"{who}: {self.what} in thread {flight.owner.name!r} of this process, which this call waited for, "
            f"failed: {quote(error)}",
            rank=rank,
            why="two threads of one process started the rendezvous at once; the one that ran it failed.",
            fix="see that thread's error; call the rendezvous from one thread only.",
        ) from error
