"""The rendezvous seam over torch's internals: a torch without them gives less precise messages, never a crash."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from distinit.rendezvous import _endpoint, _torch
from distinit.rendezvous._explain import explain_timeout
from distinit.rendezvous._restart import count_restart, restart_count
from tests.unit.rendezvous.test_rendezvous_pure import _snapshot, card


@dataclass(frozen=True)
class Node:  # the fields of torch's _NodeDesc
    addr: str
    pid: int
    local_id: int


def test_round_state_reads_torch_s_state_holder() -> None:
    state = SimpleNamespace(round=3, participants={Node("node1", 1, 0): 0}, wait_list={Node("n2", 2, 0)})
    found = _torch.round_state(SimpleNamespace(_state_holder=SimpleNamespace(state=state)))
    assert found == _torch.RoundState(known=True, round=3, participants=("node1_1_0",), wait_list=("n2_2_0",))


@pytest.mark.parametrize(
    "handler",
    [
        pytest.param(SimpleNamespace(), id="no-state-holder"),
        pytest.param(SimpleNamespace(_state_holder=SimpleNamespace()), id="holder-without-state"),
        pytest.param(SimpleNamespace(_state_holder=SimpleNamespace(state=SimpleNamespace(round="x"))), id="odd-round"),
    ],
)
def test_round_state_is_unknown_without_torch_s_internals(handler: object) -> None:
    assert _torch.round_state(handler) == _torch.UNKNOWN


def test_a_node_key_falls_back_to_repr() -> None:
    class Described:
        def __repr__(self) -> str:
            return "n1_7_0"

    assert _torch.node_key(Described()) == "n1_7_0"
    assert _torch.node_is("n1_7_0", node="n1", pid=7) and not _torch.node_is("n1_70_0", node="n1", pid=7)


def test_the_timeout_says_the_round_is_unknown_when_torch_s_state_is_not_readable() -> None:
    text = str(explain_timeout(_snapshot(torch_state=False, round=0, participants=(), wait_list=())))
    assert "how many had joined torch's round is unknown" in text
    assert "round 0" not in text and "1 of --nnodes=2 agents came" in text


def test_without_torch_s_hostname_check_the_binds_test_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_torch, "_hostname_matcher", lambda: None)
    assert _torch.matches_machine_hostname("anything") is None
    assert _endpoint._torch_match("anything") is False


def test_torch_s_hostname_check_errors_read_as_no_match(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(host: str) -> bool:
        raise OSError("name resolution failed")

    monkeypatch.setattr(_torch, "_hostname_matcher", lambda: broken)
    assert _torch.matches_machine_hostname("n1") is False


def test_restarts_without_torch_s_agent_internals() -> None:
    bare = SimpleNamespace()
    assert restart_count(bare) is None and count_restart(bare) is False
    agent = SimpleNamespace(_remaining_restarts=2, _worker_group=SimpleNamespace(spec=SimpleNamespace(max_restarts=3)))
    assert restart_count(agent) == 1 and count_restart(agent) and agent._remaining_restarts == 1


def test_handler_internals_missing() -> None:
    bare = SimpleNamespace()
    assert _torch.this_node(bare) is None
    assert _torch.this_node(SimpleNamespace(_this_node=SimpleNamespace(addr="n1"))) == "n1"
    assert _torch.forget_agent_store(bare) is False
    held = SimpleNamespace(_bootstrap_store_info=object(), _shared_tcp_store_server=object())
    assert _torch.forget_agent_store(held) and held._bootstrap_store_info is None


def test_cards_are_matched_by_node_and_pid() -> None:
    assert _torch.node_is("node1_1_0", node=card(1).node, pid=card(1).pid)
