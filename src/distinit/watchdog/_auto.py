"""Auto-calibrated timeouts: learn step times, then arm ``factor`` x the longest one, agreed across ranks."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distinit.watchdog._client import WatchdogClient
from distinit.watchdog._global import configured_client


class AutoTimeout:
    """A timeout learnt from the steps it guards: ``factor`` x the longest step seen after ``warmup`` steps.

    Until calibrated (``warmup`` steps skipped, then at least one observed), :attr:`timeout` is ``initial``.
    :meth:`agree` takes the maximum across ranks (a collective: call it on every rank at the same point), so
    every rank uses one value, as nvidia-resiliency-ext's fault tolerance does. ``floor`` keeps a run of tiny
    steps from producing a hair-trigger timeout.
    """

    __module__ = "distinit.watchdog"  # its public home: reprs and pickles never name a private module

    def __init__(self, factor: float = 5.0, warmup: int = 5, *, initial: float = 600.0, floor: float = 1.0) -> None:
        """Configure the calibration.

        Raises:
            ValueError: ``factor`` < 1, ``warmup`` < 0, or non-positive ``initial``/``floor``.
        """
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ValueError(f"factor must be >= 1, got {factor!r}")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0 steps, got {warmup!r}")
        if not (initial > 0 and floor > 0):
            raise ValueError(f"initial and floor must be > 0 seconds, got {initial!r}, {floor!r}")
        self.factor = factor
        self.warmup = warmup
        self.initial = initial
        self.floor = floor
        self.steps = 0
        self.longest = 0.0
        self.agreed: float | None = None

    @property
    def calibrated(self) -> bool:
        """Whether at least one step after the warmup has been observed."""
        return self.steps > self.warmup

    @property
    def timeout(self) -> float:
        """Seconds to arm now: the agreed value, else factor x longest step (>= floor), else ``initial``."""
        if self.agreed is not None:
            return self.agreed
        if not self.calibrated:
            return self.initial
        return max(self.floor, self.factor * self.longest)

    def observe(self, seconds: float) -> None:
        """Record one step's duration (the first ``warmup`` are ignored: compilation, warm caches)."""
        self.steps += 1
        if self.steps > self.warmup and seconds > self.longest:
            self.longest = seconds
            if self.agreed is not None:
                self.agreed = max(self.agreed, self.factor * seconds)

    def agree(self, group: Any = None) -> float:
        """All-reduce (MAX) the local timeout over ``group``; every rank then arms the same value.

        A no-op returning the local value when torch.distributed is not initialised.
        """
        local = self.timeout
        import torch.distributed as dist  # lazily: the watchdog itself needs no torch

        if dist.is_available() and dist.is_initialized():
            import torch

            value = torch.tensor([local], dtype=torch.float64)
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
            local = float(value.item())
        self.agreed = local
        return local

    @contextmanager
    def expires(self, scope: str | None = None, client: WatchdogClient | None = None) -> Iterator[None]:
        """Guard one step with the current timeout and learn from its duration (only if it completes)."""
        chosen = client or configured_client()
        began = time.monotonic()
        if chosen is None:
            yield
        else:
            with chosen.expires(self.timeout, scope=scope or "auto"):
                yield
        self.observe(time.monotonic() - began)
