"""The handler's restart decisions with torch's agent and store faked (issue 31): which restart is counted, and
when a closed rendezvous stops a healthy node's workers."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from distinit.rendezvous._card import PREFIX, AgentCard
from distinit.rendezvous._handler import MAX_CARD_BYTES, DistinitRendezvousHandler, card_limit
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
    card = AgentCard.from_object(
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
    store.set(f"{PREFIX}/failure/0/2", json.dumps([failure.to_object()]))
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


# --- attacks on the cards (issue 33, items 1, 2, 4): a huge counter, a card bomb, a beat from the future


def _card(node: str) -> str:
    return json.dumps(
        {
            "run_id": "job",
            "node": node,
            "pid": 7,
            "hostname": "h1",
            "torch": "2.13.0",
            "python": "3.11.9",
            "distinit": "0",
            "min_nodes": 2,
            "max_nodes": 2,
            "max_restarts": 1,
            "started": 0.0,
        }
    )


class CountingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.checked = 0

    def check(self, keys: list[str]) -> bool:
        self.checked += 1
        return super().check(keys)


def test_a_counter_pushed_to_a_million_reads_a_bounded_number_of_cards(caplog: pytest.LogCaptureFixture) -> None:
    store = CountingStore()
    store.set(f"{PREFIX}/count", str(10**6))
    made = handler(FakeInner(), store, agent(remaining=1))
    started = time.process_time()
    with caplog.at_level(logging.WARNING, logger="distinit.rendezvous"):
        made._refresh()
        made._refresh()
    assert store.checked <= 2 * card_limit(2)
    assert time.process_time() - started < 5.0
    warned = [r for r in caplog.records if "more than --nnodes=2 allows" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("value", ["[" * 100_000 + "]" * 100_000, "x" * (MAX_CARD_BYTES + 1)], ids=["deep", "big"])
def test_a_card_bomb_is_skipped_not_raised(value: str) -> None:
    store = FakeStore()
    store.set(f"{PREFIX}/count", "2")
    store.set(f"{PREFIX}/card/2", value)
    store.set(f"{PREFIX}/beat/2", str(time.time()))
    made = handler(FakeInner(), store, agent(remaining=1))
    made._refresh()
    assert 2 not in made._cards


def test_a_beat_from_the_future_never_keeps_a_card_fresh() -> None:
    store = FakeStore()
    store.set(f"{PREFIX}/count", "3")
    store.set(f"{PREFIX}/card/2", _card("n1_7_0"))
    store.set(f"{PREFIX}/beat/2", "1e18")
    store.set(f"{PREFIX}/card/3", _card("n2_8_0"))
    store.set(f"{PREFIX}/beat/3", str(time.time()))
    made = handler(FakeInner(), store, agent(remaining=1))
    made._refresh()
    assert 2 in made._cards and not made._fresh(2)
    assert made._fresh(3)


def _card_with(node: str, **changes: object) -> str:
    return json.dumps({**json.loads(_card(node)), **changes})


class BrokenStore(FakeStore):
    """A store whose host agent left: every call fails, as torch's TCPStore client does then."""

    broken = False

    def add(self, key: str, amount: int) -> int:
        if self.broken:
            raise RuntimeError("Broken pipe")
        return super().add(key, amount)

    def set(self, key: str, value: str | bytes) -> None:
        if self.broken:
            raise RuntimeError("Broken pipe")
        super().set(key, value)


def test_a_store_that_stops_answering_names_its_host_never_never_started() -> None:
    # Issue 33, item 3: this agent waits for a round; the agent hosting the store (whose card it read) leaves.
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousTimeoutError

    from distinit.rendezvous import AgentRendezvousConnectionError

    store = BrokenStore()
    store.set(f"{PREFIX}/count", "2")
    store.set(f"{PREFIX}/card/2", _card_with("n1", store_host=True))
    store.set(f"{PREFIX}/beat/2", str(time.time()))
    inner = FakeInner()
    inner.state.participants = set()
    made = handler(inner, store, agent(remaining=1))
    made._refresh()
    store.broken = True
    for error in (RendezvousTimeoutError("timed out"), RendezvousConnectionError("store failed")):
        with pytest.raises(AgentRendezvousConnectionError) as raised:
            made._fail(error, 5.0)
        text = f"{raised.value}\n{raised.value.why}"
        assert raised.value.kind == "lost" and "the agent hosting it, h1 pid 7 (node n1" in text, text
        assert "never started" not in text and "never seen" not in text


def test_a_card_outside_torch_s_round_is_reported_once_and_never_fatal(caplog: pytest.LogCaptureFixture) -> None:
    # Issue 33, item 4: any store client can write a card; only torch's participants' cards can fail the round.
    store = FakeStore()
    store.set(f"{PREFIX}/count", "4")
    store.set(f"{PREFIX}/card/2", _card_with("forger", torch="9.9.9"))
    store.set(f"{PREFIX}/beat/2", "1e18")
    store.set(f"{PREFIX}/card/3", _card_with("n3", pid=8, run_id="other-job", status="waiting"))
    store.set(f"{PREFIX}/beat/3", str(time.time()))
    inner = FakeInner()
    inner.state.participants = {Node("n0_1_0"), Node("n1_7_0")}
    made = handler(inner, store, agent(remaining=1))
    with caplog.at_level(logging.WARNING, logger="distinit.rendezvous"):
        made._refresh()
        assert made._verdict_while_waiting() == []
        assert made._verdict_while_waiting() == []
    messages = [r.getMessage() for r in caplog.records]
    assert sum("a foreign card on the store: h1 pid 7 (node forger" in m for m in messages) == 1, messages
    assert sum("--rdzv-id: 'job' on h0 pid 1; 'other-job' on h1 pid 8" in m for m in messages) == 1, messages
    # A participant's own card that disagrees does fail the round.
    store.set(f"{PREFIX}/count", "5")
    store.set(f"{PREFIX}/card/5", _card_with("n1", max_restarts=3))
    store.set(f"{PREFIX}/beat/5", str(time.time()))
    made._refresh()
    assert [d.field for d in made._verdict_while_waiting()] == ["--max-restarts"]
