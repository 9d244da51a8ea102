from __future__ import annotations

import pytest

from distinit.watchdog import AutoTimeout


def test_initial_until_calibrated_then_factor_times_longest() -> None:
    auto = AutoTimeout(factor=5, warmup=2, initial=600.0, floor=1.0)
    for seconds in (30.0, 20.0):  # warmup steps (compilation) are ignored
        auto.observe(seconds)
        assert auto.timeout == 600.0
    assert not auto.calibrated
    auto.observe(0.5)
    assert auto.calibrated
    assert auto.timeout == pytest.approx(2.5)
    auto.observe(0.1)
    assert auto.timeout == pytest.approx(2.5)  # the longest step rules
    auto.observe(0.8)
    assert auto.timeout == pytest.approx(4.0)


def test_floor_keeps_tiny_steps_from_a_hair_trigger() -> None:
    auto = AutoTimeout(factor=5, warmup=0, floor=3.0)
    auto.observe(0.001)
    assert auto.timeout == 3.0


def test_agree_without_a_process_group_keeps_the_local_value() -> None:
    auto = AutoTimeout(factor=2, warmup=0)
    auto.observe(4.0)
    assert auto.agree() == 8.0
    assert auto.timeout == 8.0
    auto.observe(5.0)  # a longer step after agreeing only ever raises the value
    assert auto.timeout == 10.0


def test_expires_without_a_client_still_learns() -> None:
    auto = AutoTimeout(factor=5, warmup=0)
    with auto.expires(client=None):
        pass
    assert auto.steps == 1


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        pytest.param({"factor": 0.5}, "factor", id="factor-below-1"),
        pytest.param({"warmup": -1}, "warmup", id="negative-warmup"),
        pytest.param({"initial": 0.0}, "initial", id="zero-initial"),
        pytest.param({"floor": -1.0}, "floor", id="negative-floor"),
    ],
)
def test_rejects_bad_settings(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        AutoTimeout(**kwargs)  # type: ignore[arg-type]
