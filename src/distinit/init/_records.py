"""The attempts of one rendezvous call: one record each, one structured log record per failed one."""

from __future__ import annotations

import logging
import time

from distinit._foreign import first_line
from distinit.init._attempt import AttemptFailed
from distinit.init._report import AttemptRecord, Phase

logger = logging.getLogger("distinit.init")


class AttemptLog:
    """What each attempt of one call saw, for the report, the error message and the log."""

    def __init__(self, *, rank: int, master: str, start: float, deadline_at: float) -> None:
        self.rank = rank
        self.master = master
        self.start = start
        self.deadline_at = deadline_at
        self.records: list[AttemptRecord] = []

    def record(
        self, *, number: int, begun: float, phase: Phase, generation: int | None, exc: BaseException | None
    ) -> None:
        """Append the record of attempt ``number`` (``exc`` None: it formed the group)."""
        failure = exc if isinstance(exc, AttemptFailed) else None
        self.records.append(
            AttemptRecord(
                number=number,
                generation=generation,
                phase=phase,
                elapsed=round(time.monotonic() - begun, 4),
                started_at=round(begun - self.start, 4),
                error=None if exc is None else (failure.kind if failure else type(exc).__name__),
                message=None if exc is None else first_line(failure.detail if failure else exc),
                missing_ranks=failure.missing_ranks if failure else (),
            )
        )

    def mark_retried(self) -> None:
        """The last attempt was followed by another."""
        last = self.records[-1]
        self.records[-1] = AttemptRecord.model_validate({**last.model_dump(), "retried": True})

    def last_missing(self) -> tuple[int, ...]:
        """The missing ranks of the latest attempt that counted them (empty if none did)."""
        return next((r.missing_ranks for r in reversed(self.records) if r.missing_ranks), ())

    def lines(self) -> list[str]:
        """One line per failed attempt, for the error message."""
        return [
            f"#{r.number} {r.phase} {r.elapsed:.1f} s{'' if r.error == r.phase else f' ({r.error})'}: {r.message}"
            for r in self.records
            if r.error
        ]

    def log_failure(
        self, number: int, failure: AttemptFailed, pause: float | None, *, phase: str, generation: int | None
    ) -> None:
        """The one structured record of a failed attempt (``pause`` None: the deadline ends the wait)."""
        phase = self.records[-1].phase if self.records else phase
        left = max(self.deadline_at - time.monotonic(), 0.0)
        then = f"retrying in {pause:.1f} s, {left:.0f} s left" if pause is not None else "the deadline ends the wait"
        logger.warning(
            "rank %d: rendezvous attempt %d at %s failed in %s (%s: %s); %s",
            self.rank,
            number,
            self.master,
            phase,
            failure.kind,
            failure.detail,
            then,
            extra={
                "distinit": {
                    "event": "init.attempt_failed",
                    "rank": self.rank,
                    "attempt": number,
                    "phase": phase,
                    "error": failure.kind,
                    "message": failure.detail,
                    "missing_ranks": list(failure.missing_ranks[:64]),
                    "generation": generation,
                    "elapsed_s": round(time.monotonic() - self.start, 3),
                    "pause_s": None if pause is None else round(pause, 3),
                    "left_s": round(left, 3),
                }
            },
        )
