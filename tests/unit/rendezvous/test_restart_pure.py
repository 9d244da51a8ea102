"""The restart messages: composed from the published failures, one wording on every agent (issue 31)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from distinit.rendezvous._card import AgentCard
from distinit.rendezvous._explain import Snapshot, explain_timeout
from distinit.rendezvous._restart import WorkerFailure, failures_of, restart_line, verdict_line


@dataclass
class FakeFailure:  # torch's ProcessFailure, the fields read
    local_rank: int
    pid: int
    exitcode: int
    message: object = ""
    extra: dict[str, str] = field(default_factory=dict)

    def signal_name(self) -> str:
        return "SIGKILL" if self.exitcode == -9 else "<N/A>"


@dataclass
class FakeResult:
    failures: dict[int, FakeFailure]


def failure(rank: int, **changes: object) -> WorkerFailure:
    base: dict[str, object] = {
        "agent": f"host{rank} pid {100 + rank}",
        "node": f"node{rank}",
        "round": 0,
        "rank": rank,
        "local_rank": 0,
        "pid": 200 + rank,
        "exitcode": 1,
        "error": "RuntimeError: boom",
        "restart": 0,
    }
    return WorkerFailure.from_object({**base, **changes})


@pytest.mark.parametrize(
    ("torch_failure", "expected"),
    [
        pytest.param(
            FakeFailure(0, 7, 1, {"message": "RuntimeError: boom\nmore", "extraInfo": {}}),
            "exited with code 1: RuntimeError: boom",
            id="error-file-dict",
        ),
        pytest.param(FakeFailure(0, 7, 3, "ValueError: x"), "exited with code 3: ValueError: x", id="error-file-str"),
        pytest.param(
            FakeFailure(0, 7, 1, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
            "exited with code 1 (no error file",
            id="no-error-file",
        ),
        pytest.param(
            FakeFailure(0, 7, -9, "Signal 9 (SIGKILL) received by PID 7"), "was killed by SIGKILL", id="signal"
        ),
    ],
)
def test_failures_of_torch_result_names_rank_exit_and_first_error_line(
    torch_failure: FakeFailure, expected: str
) -> None:
    [found] = failures_of(FakeResult({3: torch_failure}), agent="h pid 1", node="n", round_=2, restart=1)
    assert (found.rank, found.round, found.restart, found.pid) == (3, 2, 1, 7)
    assert found.describe().startswith("rank 3 (local_rank 0, pid 7) on h pid 1 ")
    assert expected in found.describe()


def test_restart_line_is_the_same_whatever_order_the_records_came_in() -> None:
    records = [failure(2), failure(1)]
    lines = {
        restart_line(run_id="job", ended=0, formed=1, nodes=2, failures=order, count=1, max_restarts=1, uncounted=False)
        for order in (records, records[::-1])
    }
    assert len(lines) == 1
    [line] = lines
    assert line.index("rank 1 ") < line.index("rank 2 ")
    assert line.endswith("restart 1 of --max-restarts=1 (TORCHELASTIC_RESTART_COUNT=1)")


def test_restart_line_names_a_membership_change_and_an_uncounted_one() -> None:
    line = restart_line(run_id="job", ended=3, formed=4, nodes=3, failures=[], count=0, max_restarts=2, uncounted=True)
    assert "a node joined or left (membership change, not counted" in line
    assert "uncounted membership change" in line


def test_verdict_line_names_the_restart_and_the_failure() -> None:
    line = verdict_line(run_id="job", round_=1, failures=[failure(1, restart=1)], max_restarts=1)
    assert line.startswith("rendezvous 'job': round 1 failed after restart 1 of --max-restarts=1, none left: rank 1")
    assert "RuntimeError: boom" in line


def test_a_restart_round_that_times_out_mentions_torchs_exit_barrier() -> None:
    def card(pid: int) -> AgentCard:
        fields = {"run_id": "job", "node": f"n{pid}", "pid": pid, "hostname": f"h{pid}", "torch": "2.13.0"}
        more = {"python": "3.11.9", "distinit": "0", "min_nodes": 2, "max_nodes": 2, "started": 0.0}
        return AgentCard.from_object({**fields, **more})

    def snap(round_: int) -> Snapshot:
        return Snapshot(
            run_id="job",
            endpoint="e:1",
            round=round_,
            min_nodes=2,
            max_nodes=2,
            participants=(),
            wait_list=("n1_1_0",),
            waited=20.0,
            join_timeout=20.0,
            cards=(card(1), card(2)),
            beats={0: 100.0, 1: 10.0},
            now=100.0,
        )

    assert "exit barrier" in explain_timeout(snap(1)).why
    assert "exit barrier" not in explain_timeout(snap(0)).why
    assert "joined, then stopped" in explain_timeout(snap(1)).why


def test_a_failure_record_round_trips_and_a_malformed_one_is_refused() -> None:
    one = failure(1, signal="SIGKILL", exitcode=-9, restart=2)
    assert WorkerFailure.from_object(json.loads(json.dumps(one.to_object()))) == one
    with pytest.raises(ValueError, match=r"WorkerFailure\.exitcode:"):
        WorkerFailure.from_object({**one.to_object(), "exitcode": "1"})
    with pytest.raises(ValueError, match="rank"):
        WorkerFailure.from_object({k: v for k, v in one.to_object().items() if k != "rank"})
    with pytest.raises(ValueError, match="JSON object"):
        WorkerFailure.from_object([one.to_object()])
