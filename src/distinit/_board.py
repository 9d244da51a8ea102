"""The verdict board: one store key that every rank must read before the store host may leave.

A verdict (a duplicate rank, a world-size mismatch, a lost rank, gloo's loopback trap, who went away after
setup) is found by one rank and must reach every rank, identically, through the store rank 0 hosts. The
board is that one protocol:

* :meth:`Board.publish` -- first writer wins (``compare_set``): every rank raises the same verdict;
* :meth:`Board.read` -- the verdict, if one was published (one round trip when none was);
* :meth:`Board.acknowledge` -- this rank has read it (counted once per rank, under ``<key>/ack/<rank>``
  and ``<key>/seen``);
* :meth:`Board.linger` -- on the store host: stay up until every rank acknowledged, at most a bound (and,
  when some ranks may never read it, no longer than the count stays still for :data:`LINGER_QUIET` s).

A top-level leaf (stdlib only; the store is typed by :class:`BoardStore`, which torch's stores satisfy). Its
users are :mod:`distinit.init`'s join, group forming and liveness; the torchrun backend does not use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

#: Longest time the store host stays up after a verdict so that the other ranks can read it.
LINGER = 3.0
#: Seconds without a new rank acknowledging after which the host stops lingering (when ``settled`` allows).
LINGER_QUIET = 1.0
#: How often the lingering host reads the acknowledgement count.
LINGER_POLL = 0.05


class BoardStore(Protocol):
    """The store calls the board uses (``torch.distributed.Store`` has them all)."""

    def add(self, key: str, value: int, /) -> int: ...

    def check(self, keys: list[str], /) -> bool: ...

    def get(self, key: str, /) -> bytes: ...

    def compare_set(self, key: str, expected: str, desired: str, /) -> bytes: ...


def text(value: bytes | str) -> str:
    """A store value as text (bytes decoded as UTF-8; a stray byte becomes U+FFFD, never an error)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _never(seen: int) -> bool:
    return False


class Board:
    """One verdict key on a store, seen from one rank (see the module docstring)."""

    def __init__(self, store: BoardStore, key: str, *, rank: int, world_size: int) -> None:
        self.store, self.key, self.rank, self.world_size = store, key, rank, world_size

    def publish(self, verdict: str) -> str:
        """Publish ``verdict`` unless another was first; the value on the board now (``verdict`` if ours won)."""
        return text(self.store.compare_set(self.key, "", verdict))

    def replace(self, old: str, verdict: str) -> str:
        """Put ``verdict`` in place of ``old`` (what the caller read and rejects) unless the board changed since."""
        return text(self.store.compare_set(self.key, old, verdict))

    def read(self) -> str | None:
        """The published value, or None."""
        if not self.store.check([self.key]):
            return None
        return text(self.store.get(self.key))

    def acknowledge(self) -> None:
        """Count this rank among those that read the verdict (once, however often it is called)."""
        if self.store.add(f"{self.key}/ack/{self.rank}", 1) == 1:
            self.store.add(f"{self.key}/seen", 1)

    def acknowledged(self, ranks: Sequence[int]) -> bool:
        """Whether every one of ``ranks`` acknowledged (one round trip)."""
        return not ranks or self.store.check([f"{self.key}/ack/{rank}" for rank in ranks])

    def seen(self) -> int:
        """How many ranks acknowledged."""
        return self.store.add(f"{self.key}/seen", 0)

    def linger(
        self, *, bound: float = LINGER, settled: Callable[[int], bool] = _never, quiet: float = LINGER_QUIET
    ) -> None:
        """Stay up until every rank acknowledged, at most ``bound`` s (the store host calls it; others need not).

        ``settled(seen)``: True when the ranks that have not acknowledged may never do so (they are the lost
        ones, or the host cannot know which ranks are right); then the host also leaves once the count
        stayed still for ``quiet`` s. A store that fails ends the wait: nobody can read it any more.
        """
        now = time.monotonic()
        end, last = now + bound, (-1, now)
        while now < end:
            try:
                seen = self.seen()
                if seen >= self.world_size:
                    return
                if seen != last[0]:
                    last = (seen, now)
                elif now - last[1] >= quiet and settled(seen):
                    return
            except (RuntimeError, OSError):  # torch's DistError is a RuntimeError
                return
            time.sleep(LINGER_POLL)
            now = time.monotonic()
