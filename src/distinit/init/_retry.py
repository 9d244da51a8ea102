"""The retry loop over rendezvous attempts; the only module that imports tenacity.

tenacity types stay private here: callers pass plain callables (attempt, pause, hooks) and a
:class:`~distinit.init._backoff.Backoff`. The deadline is ours (an absolute monotonic time), because a
blocking attempt cannot be interrupted by tenacity (jd/tenacity#373): each attempt clamps its own bounds
to what is left, pauses are clamped too, and no attempt starts with less than ``min_attempt`` left.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

import tenacity

from distinit.init._attempt import AttemptFailed
from distinit.init._backoff import Backoff

T = TypeVar("T")


def retry_until(
    attempt: Callable[[int], T],
    *,
    deadline_at: float,
    backoff: Backoff,
    rng: random.Random,
    pause: Callable[[float], None],
    on_retry: Callable[[int, AttemptFailed, float], None],
    give_up: Callable[[AttemptFailed], NoReturn],
    min_attempt: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``attempt(n)`` (n = 1, 2, ...) until it returns, pausing per ``backoff`` between failures.

    Only :class:`AttemptFailed` is retried; anything else (our misconfiguration verdicts) propagates at
    once. ``on_retry(n, failure, pause_s)`` runs before each pause; ``give_up(last_failure)`` runs when
    the deadline leaves no room for another attempt and must raise.
    """

    def stop(state: tenacity.RetryCallState) -> bool:
        return deadline_at - clock() <= min_attempt

    def wait(state: tenacity.RetryCallState) -> float:
        room = deadline_at - clock() - min_attempt
        return max(0.0, min(backoff.delay(state.attempt_number, rng), room))

    def failure(state: tenacity.RetryCallState) -> AttemptFailed:
        exc = state.outcome.exception() if state.outcome is not None else None
        if not isinstance(exc, AttemptFailed):  # pragma: no cover - only AttemptFailed is retried
            raise TypeError(f"unexpected retried outcome {exc!r}")
        return exc

    def before_sleep(state: tenacity.RetryCallState) -> None:
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        on_retry(state.attempt_number, failure(state), sleep)

    def exhausted(state: tenacity.RetryCallState) -> NoReturn:
        give_up(failure(state))

    retrying = tenacity.Retrying(
        stop=stop,
        wait=wait,
        retry=tenacity.retry_if_exception_type(AttemptFailed),
        before_sleep=before_sleep,
        sleep=pause,
        retry_error_callback=exhausted,
        reraise=True,
    )
    count = 0

    def once() -> T:
        nonlocal count
        count += 1
        return attempt(count)

    return retrying(once)
