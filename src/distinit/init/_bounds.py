"""The time bounds of one rendezvous call, validated once on entry by the package's one duration policy."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

from distinit._duration import to_seconds, to_timedelta


@dataclass(frozen=True)
class Bounds:
    """``deadline``, ``attempt_timeout`` and ``pg_timeout`` as float seconds (``inf``: no limit).

    Infinity is accepted for all three and means "no limit"; every native wait clamps it (and any huge
    finite value) with :func:`distinit._duration.wait_bound`, so nothing raises ``OverflowError``.
    """

    deadline: float
    attempt_timeout: float
    pg_timeout: float | None

    @classmethod
    def of(cls, *, deadline: object, attempt_timeout: object, pg_timeout: object) -> Bounds:
        """Validate the caller's arguments (seconds or ``timedelta``).

        Raises:
            TypeError: a value is not a number of seconds or a ``timedelta`` (``"600"`` and ``True`` included).
            ValueError: a value is NaN, zero or negative.
        """
        return cls(
            deadline=to_seconds(deadline, "deadline", allow_inf=True),
            attempt_timeout=to_seconds(attempt_timeout, "attempt_timeout", allow_inf=True),
            pg_timeout=None if pg_timeout is None else to_seconds(pg_timeout, "pg_timeout", allow_inf=True),
        )

    def init_timeout(self) -> timedelta | None:
        """The ``timeout=`` for ``init_process_group`` when no bootstrap bound of ours applies (None: torch's)."""
        return None if self.pg_timeout is None else to_timedelta(self.pg_timeout)

    def collective_timeout(self, backend: str) -> timedelta:
        """The collective timeout after init: ``pg_timeout``, or torch's default (10 min NCCL, 30 min others)."""
        if self.pg_timeout is not None:
            return to_timedelta(self.pg_timeout)
        if backend == "nccl" and default_pg_nccl_timeout is not None:
            return default_pg_nccl_timeout
        return default_pg_timeout
