"""How long a failure may persist before it becomes its specific error: a pure policy over a fake-able clock.

Some failures cure themselves (a DNS record that appears late, a previous run freeing its port), so the
rendezvous keeps retrying them; only when one kind of failure has lasted for its whole grace period does
waiting stop and the specific error (``MasterUnreachableError``, ``PortInUseError``) replace the generic
timeout. Any other kind seen in between starts the count again.
"""

from __future__ import annotations

from dataclasses import dataclass

from distinit.init._attempt import FailureKind

#: Grace periods in seconds; kinds without one (refused, timeout, store, join, init) are retried to the deadline.
DNS_GRACE = 60.0
UNREACHABLE_GRACE = 10.0
PORT_GRACE = 30.0


@dataclass(frozen=True)
class Persisted:
    """A failure that outlasted its grace period: its kind and how long it lasted, in seconds."""

    kind: FailureKind
    lasted: float


class Grace:
    """Track the current streak of one failure kind and say when it outlasted its grace period.

    Pure apart from its own streak: the caller passes every time (``since``, ``now``), so tests drive it
    with a fake clock. ``foreign`` (a non-TCPStore program on the port) gets ``attempt_timeout``, because a
    real store answers the handshake in milliseconds.
    """

    def __init__(
        self,
        *,
        foreign: float,
        dns: float = DNS_GRACE,
        unreachable: float = UNREACHABLE_GRACE,
        port_busy: float = PORT_GRACE,
    ) -> None:
        self._limits: dict[FailureKind, float] = {
            "dns": dns,
            "unreachable": unreachable,
            "port_busy": port_busy,
            "foreign": foreign,
        }
        self._streak: tuple[FailureKind, float] | None = None

    def observe(self, kind: FailureKind, since: float, now: float) -> Persisted | None:
        """Record that ``kind`` was seen from ``since`` until ``now``; a :class:`Persisted` once past its grace.

        ``since`` matters for the first sight only: a probe that waited 3 s for a handshake saw the failure
        from its start, so the grace counts from there.
        """
        if self._streak is None or self._streak[0] != kind:
            self._streak = (kind, since)
        lasted = now - self._streak[1]
        limit = self._limits.get(kind)
        return Persisted(kind, lasted) if limit is not None and lasted >= limit else None

    def clear(self) -> None:
        """Forget the streak (the master answered as a TCPStore)."""
        self._streak = None
