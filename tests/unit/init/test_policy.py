"""Pure tests of the init policies: Backoff, the pause between attempts (fake clock), reports, exports."""

from __future__ import annotations

import os
import random

import pytest
from pydantic import ValidationError

import distinit.init
from distinit.init import AttemptRecord, Backoff, InitReport
from distinit.init._policy import MIN_ATTEMPT, next_pause


def test_backoff_grows_caps_and_jitters() -> None:
    policy = Backoff(initial=1.0, factor=2.0, cap=5.0, jitter=0.0)
    rng = random.Random(0)
    assert [policy.delay(n, rng) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    jittered = Backoff(jitter=0.5)
    assert all(1.0 <= jittered.delay(1, rng) <= 1.5 for _ in range(100))
    assert Backoff().delay(10_000, rng) <= 31.0  # no overflow on huge attempt numbers


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"initial": 0}, id="zero-initial"),
        pytest.param({"factor": 0.5}, id="shrinking"),
        pytest.param({"cap": -1}, id="negative-cap"),
        pytest.param({"jitter": -0.1}, id="negative-jitter"),
        pytest.param({"retries": 3}, id="unknown-field"),
    ],
)
def test_backoff_rejects_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Backoff(**bad)


def test_backoff_attempt_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        Backoff().delay(0, random.Random())


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_next_pause_follows_the_backoff_while_there_is_room() -> None:
    clock = FakeClock()
    policy = Backoff(jitter=0)
    pauses = [next_pause(n, deadline_at=100.0, backoff=policy, rng=random.Random(0), clock=clock) for n in (1, 2, 3)]
    assert pauses == [1.0, 2.0, 4.0]


def test_next_pause_is_clamped_to_the_deadline_and_says_when_to_give_up() -> None:
    clock = FakeClock()
    policy = Backoff(initial=4.0, jitter=0)
    seen: list[float] = []
    while True:
        clock.now += 3.0  # the attempt itself, which failed
        pause = next_pause(len(seen) + 1, deadline_at=10.0, backoff=policy, rng=random.Random(0), clock=clock)
        if pause is None:
            break
        seen.append(pause)
        clock.sleep(pause)
    assert seen == [4.0] and clock.now == 10.0  # the pause is clamped: the last attempt ends at the deadline
    assert 10.0 - clock.now <= MIN_ATTEMPT  # None: no room for another attempt


def test_report_is_frozen_and_summarises() -> None:
    record = AttemptRecord(number=1, phase="done", elapsed=0.1, started_at=0.0)
    report = InitReport(
        backend="gloo", rank=0, world_size=2, master="h:1", store="hosted", attempts=(record,), elapsed=0.2
    )
    assert "formed in 0.20 s after 1 attempt(s)" in str(report)
    with pytest.raises(ValidationError):
        report.rank = 3  # type: ignore[misc]
    assert InitReport.model_validate_json(report.model_dump_json()) == report


def test_exports() -> None:
    public = {name for name in dir(distinit.init) if not name.startswith("_")}
    assert set(distinit.init.__all__) <= public
    assert {"init_with_retry", "setup", "teardown", "InitReport", "Backoff"} <= set(distinit.init.__all__)


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        pytest.param({"deadline": 0}, ValueError, "deadline must be > 0", id="zero-deadline"),
        pytest.param({"deadline": -5.0}, ValueError, "deadline must be > 0", id="negative-deadline"),
        pytest.param({"deadline": float("nan")}, ValueError, "deadline must be a number", id="nan-deadline"),
        pytest.param({"deadline": "2"}, TypeError, "deadline must be a number", id="string-deadline"),
        pytest.param({"deadline": True}, TypeError, "deadline must be a number", id="bool-deadline"),
        pytest.param({"attempt_timeout": 0}, ValueError, "attempt_timeout must be > 0", id="zero-attempt"),
        pytest.param({"attempt_timeout": "30"}, TypeError, "attempt_timeout", id="string-attempt"),
        pytest.param({"pg_timeout": -1}, ValueError, "pg_timeout must be > 0", id="negative-pg"),
        pytest.param({"pg_timeout": float("nan")}, ValueError, "pg_timeout", id="nan-pg"),
    ],
)
def test_init_with_retry_rejects_bad_durations(
    kwargs: dict[str, object], error: type[Exception], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No launcher variables at all: a bad duration must be refused before the world is even resolved.
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(error, match=named):
        distinit.init.init_with_retry("gloo", **kwargs)  # type: ignore[arg-type]


def test_setup_refuses_a_bad_duration_before_exporting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    environ = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(TypeError, match="deadline"):
        distinit.init.setup("gloo", environ=environ, deadline="2")  # type: ignore[arg-type]
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ  # nothing was exported
