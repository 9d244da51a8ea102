"""The one duration policy (distinit._duration) and the one foreign-error line (distinit._foreign)."""

from __future__ import annotations

import math
import threading
from datetime import timedelta

import pytest

from distinit._duration import MAX_WAIT, to_seconds, to_timedelta, wait_bound
from distinit._foreign import first_line


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1.0), (0.25, 0.25), (timedelta(minutes=2), 120.0), (10**20, 1e20)],
)
def test_accepts_seconds_and_timedelta(value: object, expected: float) -> None:
    assert to_seconds(value, "deadline") == expected


@pytest.mark.parametrize("value", ["600", b"1", True, False, None, [1], 1j])
def test_rejects_what_is_not_a_number_of_seconds(value: object) -> None:
    with pytest.raises(TypeError, match="deadline"):
        to_seconds(value, "deadline")


@pytest.mark.parametrize("value", [math.nan, -1, -0.5, timedelta(seconds=-1), 0, 0.0, -math.inf])
def test_rejects_nan_negative_and_zero(value: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        to_seconds(value, "timeout")


def test_zero_only_when_allowed() -> None:
    assert to_seconds(0, "grace", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="grace"):
        to_seconds(-1, "grace", allow_zero=True)


@pytest.mark.parametrize("value", [math.inf, 10**400, timedelta.max])
def test_infinity_only_where_documented(value: object) -> None:
    if value is timedelta.max:  # finite, about 2.7e3 years: accepted, and clamped for waits
        assert to_seconds(value, "deadline") > MAX_WAIT
        return
    with pytest.raises(ValueError, match="finite"):
        to_seconds(value, "deadline")
    assert to_seconds(value, "deadline", allow_inf=True) == math.inf


def test_native_waits_never_overflow() -> None:
    # timedelta(seconds=inf) and Thread.join(1e300) raise OverflowError; the bounded forms do not.
    assert wait_bound(math.inf) == MAX_WAIT <= threading.TIMEOUT_MAX
    assert wait_bound(-3) == 0.0
    assert to_timedelta(1e300) == timedelta(seconds=MAX_WAIT)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join(wait_bound(math.inf))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer",
            "Connection closed by peer",
        ),
        ("\n\n  first\nsecond", "first"),
        ("", "no detail"),
        (TimeoutError(), "TimeoutError"),
        (RuntimeError("x" * 1000), "x" * 300),
    ],
)
def test_first_line_of_a_foreign_error(source: BaseException | str, expected: str) -> None:
    assert first_line(source) == expected
