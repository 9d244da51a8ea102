"""The pause between rendezvous attempts, as a small pure policy object."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field


class Backoff(BaseModel):
    """Pause between rendezvous attempts: ``initial * factor**(n-1)``, capped at ``cap``, plus jitter.

    The default (1 s, x2, cap 30 s, up to 1 s of uniform jitter) spreads the retries of many ranks so that
    they do not hammer the store in lock-step, while keeping the last attempt close to the deadline.
    The pause is always clamped to what is left of the deadline by :func:`distinit.init_with_retry`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial: float = Field(default=1.0, gt=0, description="Seconds after the first failed attempt.")
    factor: float = Field(default=2.0, ge=1, le=10, description="Growth per further failed attempt.")
    cap: float = Field(default=30.0, gt=0, description="Largest pause before jitter, in seconds.")
    jitter: float = Field(default=1.0, ge=0, description="Uniform random seconds added to each pause.")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based). Pure apart from ``rng``.

        Raises:
            ValueError: ``attempt`` is smaller than 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt!r}")
        base = min(self.cap, self.initial * self.factor ** min(attempt - 1, 60))
        return base + (rng.uniform(0.0, self.jitter) if self.jitter else 0.0)


# Their public home, set once built (pydantic resolves the annotations in the defining module): reprs and
# pickles never name a private module.
Backoff.__module__ = "distinit.init"
