"""The handler's restart decisions with torch's agent and store faked (issue 31): which restart is counted, and
when a closed rendezvous stops a healthy node's workers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from distinit.rendezvous._card import PREFIX, AgentCard
from distinit.rendezvous._handler import DistinitRendezvousHandler
from distinit.rendezvous._restart import WorkerFailure


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def check(self, keys: list[str]) -> bool:
        return all(key in self.data for key in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[key] for key in keys]


@dataclass(frozen=True)
class Node:  # torch's _NodeDesc: hashable, printed as addr_pid_localid
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass
class FakeInner:
    waiting: int = 0
    state: Any = field(default_factory=lambda: SimpleNamespace(wait_list=set(), closed=False, round=0))
    use_agent_store: bool = True

    def num_nodes_waiting(self) -> int:
        return self.waiting

    @property
    def _state_holder(self) -> Any:
        return SimpleNamespace(state=self.state)


def agent(remaining: int, max_restarts: int = 1) -> Any:
    return SimpleNamespace(
        _remaining_restarts=remaining, _worker_group=SimpleNamespace(spec=SimpleNamespace(max_restarts=max_restarts))
    )


def handler(inner: FakeInner, store: FakeStore, torch_agent: Any) -> DistinitRendezvousHandler:
    card = AgentCard.model_validate(
        {
            "run_id": "job",
            "node": "n0",
            "pid": 1,
            "hostname": "h0",
            "torch": "2.13.0",
            "python": "3.11.9",
            "distinit": "0",
            "min_nodes": 2,
            "max_nodes": 2,
            "max_restarts": 1,
            "started": 0.0,
        }
    )
    made = DistinitRendezvousHandler(
        inner,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        card,
        endpoint="127.0.0.1:1",
        shared_endpoint=False,
        beat_interval=5.0,
    )
    made._agent = torch_agent
    made._previous = ("n0_1_0", "n1_2_0")  # the round that ran: this node and n1
    made._index = 1
    return made


def test_a_participant_rejoining_is_counted_here_too() -> None:
    inner = FakeInner(waiting=1)
    inner.state.wait_list = {Node("n1_2_0")}  # n1's workers failed: it counted a restart and re-joins
    torch_agent = agent(remaining=1)
    made = handler(inner, FakeStore(), torch_agent)
    assert made.num_nodes_waiting() == 1
    assert torch_agent._remaining_restarts == 0  # TORCHELASTIC_RESTART_COUNT=1 here as on n1
    assert not made._uncounted
    made.num_nodes_waiting()  # torch polls again before it restarts: counted once
    assert torch_agent._remaining_restarts == 0


def test_a_new_node_is_a_membership_change_counted_nowhere() -> None:
    inner = FakeInner(waiting=1)
    inner.state.wait_list = {Node("n2_3_0")}
    torch_agent = agent(remaining=1)
    made = handler(inner, FakeStore(), torch_agent)
    assert made.num_nodes_waiting() == 1
    assert torch_agent._remaining_restarts == 1
    assert not made._uncounted


def test_no_restart_left_to_count_is_named_uncounted() -> None:
    inner = FakeInner(waiting=1)
    inner.state.wait_list = {Node("n1_2_0")}
    made = handler(inner, FakeStore(), agent(remaining=0))
    assert made.num_nodes_waiting() == 1
    assert made._uncounted


def test_closed_after_a_failure_stops_this_nodes_workers_and_acknowledges() -> None:
    store = FakeStore()
    failure = WorkerFailure(agent="h1 pid 2", node="n1", round=0, rank=1, local_rank=0, pid=9, exitcode=1, restart=1)
    store.set(f"{PREFIX}/count", "2")
    store.set(f"{PREFIX}/failure/0/2", json.dumps([failure.model_dump()]))
    inner = FakeInner(waiting=0)
    inner.state.closed = True
    made = handler(inner, store, agent(remaining=0))
    assert made.num_nodes_waiting() == 1  # torch restarts: the next join raises the closed verdict
    assert made._ended == [failure]
    assert store.data[f"{PREFIX}/verdict-read/0"] == b"1"


def test_closed_after_success_leaves_the_workers_alone() -> None:
    store = FakeStore()
    store.set(f"{PREFIX}/count", "2")
    inner = FakeInner(waiting=0)
    inner.state.closed = True
    made = handler(inner, store, agent(remaining=1))
    assert made.num_nodes_waiting() == 0
    assert made.num_nodes_waiting() == 0
