"""The one duration policy of distinit: seconds (int/float) or ``timedelta``, normalised once on entry.

Every public argument that is a span of time (``deadline``, ``timeout``, ``after``, ``grace``...) goes
through :func:`to_seconds`, so the capabilities agree on what they accept: a bool, a string, NaN, a
negative or zero span is a caller's mistake (``TypeError``/``ValueError`` naming the argument), and
infinity is accepted only where the caller documents it. Native waits (``Thread.join``,
``timedelta(seconds=...)``, ``select``) overflow on huge values, so they go through :func:`wait_bound`.

Imports only the standard library (a leaf, like ``errors``).
"""

from __future__ import annotations

import math
import threading
from datetime import timedelta

__all__ = ["MAX_WAIT", "to_seconds", "to_timedelta", "wait_bound"]

#: The longest single native wait distinit ever starts, in seconds (a year): far below
#: ``threading.TIMEOUT_MAX`` and ``timedelta.max``, so no wait overflows, and long enough that a
#: documented "no limit" (``inf``) behaves as one in practice.
MAX_WAIT = min(365.0 * 86400.0, threading.TIMEOUT_MAX)


def to_seconds(value: object, name: str, *, allow_inf: bool = False, allow_zero: bool = False) -> float:
    """Return ``value`` as float seconds, or raise naming ``name``.

    Args:
        value: an ``int``/``float`` number of seconds or a ``datetime.timedelta``.
        name: the argument's name, as the caller spells it (used in the message).
        allow_inf: accept ``math.inf`` ("no limit"); only where the caller documents it.
        allow_zero: accept ``0`` (for example "no grace").

    Raises:
        TypeError: not a number or a ``timedelta`` (a ``bool`` or a ``str`` included: ``"600"`` is not seconds).
        ValueError: NaN, negative, zero (unless ``allow_zero``), or infinite (unless ``allow_inf``).
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = type(value).__name__
        raise TypeError(f"{name} must be a number of seconds or a datetime.timedelta, got {kind} {value!r}")
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float: certainly "infinite" for any wait
            seconds = math.inf if value > 0 else -math.inf
    if math.isnan(seconds):
        raise ValueError(f"{name} must be a number of seconds, got NaN")
    if math.isinf(seconds) and seconds > 0:
        if allow_inf:
            return math.inf
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    return seconds


def wait_bound(seconds: float) -> float:
    """``seconds`` clamped to what a native wait accepts (``[0, MAX_WAIT]``); ``inf`` becomes ``MAX_WAIT``."""
    return min(max(seconds, 0.0), MAX_WAIT)


def to_timedelta(seconds: float) -> timedelta:
    """A ``timedelta`` for ``seconds`` that never overflows (clamped by :func:`wait_bound`)."""
    return timedelta(seconds=wait_bound(seconds))
