"""init/_attempt.py's pure parts: the attempts' records and the launcher's own count."""

from __future__ import annotations

import pytest

from distinit.init._attempt import AttemptLog, launched
from distinit.init._policy import AttemptFailed


def test_the_log_keeps_one_record_per_attempt_and_the_last_missing_ranks() -> None:
    log = AttemptLog(rank=1, master="h:1", start=0.0, deadline_at=1e12)
    failure = AttemptFailed("join", "1/2 ranks joined generation 0, missing ranks 1", missing_ranks=(1,))
    log.record(number=1, begun=0.0, phase="join", generation=0, exc=failure)
    log.mark_retried()
    log.record(number=2, begun=0.0, phase="probe", generation=None, exc=AttemptFailed("refused", "nothing"))
    assert [r.retried for r in log.records] == [True, False]
    assert log.last_missing() == (1,)
    assert log.lines()[0].startswith("#1 join") and "(refused)" in log.lines()[1]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({"OMPI_COMM_WORLD_SIZE": "4"}, (4, "OMPI_COMM_WORLD_SIZE=4"), id="mpirun"),
        pytest.param({"SLURM_NTASKS": "8"}, None, id="batch-script-allocation-only"),
        pytest.param(
            {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "3"},
            (6, "torchrun: LOCAL_WORLD_SIZE=2 x 3 node(s)"),
            id="torchrun",
        ),
        pytest.param({"PMI_SIZE": " "}, None, id="blank"),
    ],
)
def test_launched(environ: dict[str, str], expected: tuple[int, str] | None) -> None:
    assert launched(environ) == expected
