"""init/_report.py: what a report says of itself, what a record refuses, and the public name it travels under."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pydantic import ValidationError

from distinit.env import DistEnv
from distinit.init._report import AttemptRecord, InitReport


def _report(**changes: Any) -> InitReport:
    fields: dict[str, Any] = {"backend": "nccl", "rank": 3, "world_size": 8, "store": "client", "elapsed": 1.234}
    return InitReport.model_validate({**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "summary"),
    [
        pytest.param(
            {"master": "10.0.0.1:29500", "attempts": (AttemptRecord(number=1, phase="done", elapsed=1, started_at=0),)},
            "rank 3/8: nccl process group formed in 1.23 s after 1 attempt(s) via client store at 10.0.0.1:29500",
            id="formed",
        ),
        pytest.param({}, "rank 3/8: nccl process group formed in 1.23 s after 0 attempt(s) alone", id="no-endpoint"),
        pytest.param(
            {"already_initialized": True, "store": "existing", "master": "10.0.0.1:29500"},
            "rank 3/8: nccl process group already initialised",
            id="already",
        ),
    ],
)
def test_the_report_summarises_how_the_group_came(changes: dict[str, Any], summary: str) -> None:
    assert str(_report(**changes)).startswith(summary)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"number": 0}, id="attempts-count-from-1"),
        pytest.param({"phase": "waiting"}, id="unknown-phase"),
        pytest.param({"elapsed": -0.1}, id="negative-time"),
        pytest.param({"retries": 2}, id="unknown-field"),
    ],
)
def test_a_record_refuses_what_no_attempt_can_be(changes: dict[str, Any]) -> None:
    fields = {"number": 1, "phase": "join", "elapsed": 0.5, "started_at": 0.0}
    AttemptRecord.model_validate(fields)
    with pytest.raises(ValidationError):
        AttemptRecord.model_validate({**fields, **changes})


def test_the_report_refuses_an_unknown_store_and_a_world_of_none() -> None:
    with pytest.raises(ValidationError):
        _report(store="shared")
    with pytest.raises(ValidationError):
        _report(world_size=0)


def test_a_report_travels_under_its_public_name_with_its_world() -> None:
    world = DistEnv(rank=3, local_rank=1, world_size=8, launcher="torchrun", master_addr="10.0.0.1", master_port=1)
    report = _report(world=world, generation=2)
    assert InitReport.__module__ == AttemptRecord.__module__ == "distinit.init"
    assert InitReport.model_validate_json(report.model_dump_json()) == report
    again = pickle.loads(pickle.dumps(report))
    assert again == report and again.world == world and b"_report" not in pickle.dumps(report)
