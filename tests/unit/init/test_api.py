"""init/_setup.py without a process group: the normalised call, the process state, the lost-peer lookup."""

from __future__ import annotations

import pytest

from distinit.init import lost_peer
from distinit.init._policy import Backoff
from distinit.init._setup import Arguments
from distinit.init._thread import PROCESS


@pytest.fixture(autouse=True)
def _fresh_process() -> None:
    PROCESS.reset()


def test_the_call_is_normalised_once() -> None:
    call = Arguments.of(deadline=60, attempt_timeout=5, pg_timeout=None, backoff=None, verify=True)
    assert call.bounds.deadline == 60.0 and call.bounds.pg_timeout is None
    assert call.backoff == Backoff() and call.patience > 60.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"deadline": "600"}, TypeError, id="string-deadline"),
        pytest.param({"attempt_timeout": 0}, ValueError, id="zero-attempt-timeout"),
        pytest.param({"pg_timeout": float("nan")}, ValueError, id="nan-pg-timeout"),
    ],
)
def test_a_bad_argument_is_refused_on_entry(kwargs: dict[str, object], error: type[Exception]) -> None:
    arguments: dict[str, object] = {"deadline": 60, "attempt_timeout": 5, "pg_timeout": None, **kwargs}
    with pytest.raises(error):
        Arguments.of(**arguments, backoff=None, verify=True)  # type: ignore[arg-type]


def test_process_state_numbers_calls_and_resets() -> None:
    assert PROCESS.take_call() == (1, False)
    PROCESS.resume = True  # an interrupted call gives its number back
    assert PROCESS.take_call() == (1, True)
    assert PROCESS.take_call() == (2, False)
    PROCESS.reset()
    assert PROCESS.take_call() == (1, False) and PROCESS.setup is None and PROCESS.leftover is None


def test_no_lost_peer_without_setup() -> None:
    assert lost_peer(RuntimeError("Connection closed by peer")) is None
