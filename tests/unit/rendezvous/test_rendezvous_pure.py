"""The torchrun handler's pure parts: the host decision, the agents' disagreements, the explained timeout."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousTimeoutError

import distinit
from distinit._identity import local_identity
from distinit.rendezvous import AgentConfigMismatchError, AgentRendezvousTimeoutError
from distinit.rendezvous._card import (
    AgentCard,
    disagreements,
    env_digest,
    launch_flags,
    machine,
    round_cards,
    shared_machines,
)
from distinit.rendezvous._endpoint import decide_host
from distinit.rendezvous._errors import AgentRendezvousConnectionError
from distinit.rendezvous._explain import Snapshot, explain_lost, explain_timeout


def card(pid: int, **changes: object) -> AgentCard:
    base: dict[str, object] = {
        "run_id": "job",
        "node": f"node{pid}",
        "pid": pid,
        "hostname": f"host{pid}",
        "boot_id": f"boot{pid}",
        "netns": 1,
        "torch": "2.13.0",
        "python": "3.11.9",
        "distinit": "0.1.0",
        "min_nodes": 2,
        "max_nodes": 2,
        "nproc_per_node": 4,
        "max_restarts": 0,
        "started": 1000.0,
    }
    return AgentCard.from_object({**base, **changes})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        pytest.param({"max_nodes": 3, "min_nodes": 3}, "--nnodes", id="nnodes"),
        pytest.param({"nproc_per_node": 8}, "--nproc-per-node", id="nproc"),
        pytest.param({"max_restarts": 3}, "--max-restarts", id="max-restarts"),
        pytest.param({"torch": "2.12.0"}, "torch", id="torch"),
        pytest.param({"python": "3.10.1"}, "python", id="python"),
        pytest.param({"run_id": "other"}, "--rdzv-id", id="rdzv-id"),
    ],
)
def test_a_disagreement_is_named(changes: dict[str, object], field: str) -> None:
    found = [d for d in disagreements([card(1), card(2, **changes)]) if d.fatal]
    assert [d.field for d in found] == [field]
    assert "host1 pid 1" in found[0].describe() and "host2 pid 2" in found[0].describe()


def test_agreeing_agents_and_unknown_flags_do_not_disagree() -> None:
    assert disagreements([card(1), card(2, nproc_per_node=None, python="3.11.2")]) == []


def test_shared_endpoint_allows_two_jobs_and_finished_jobs_never_count() -> None:
    assert not disagreements([card(1), card(2, run_id="other")], shared_endpoint=True)
    assert not disagreements([card(1), card(2, run_id="other", status="joined")])


def test_environment_differences_are_a_warning_without_values() -> None:
    digest = env_digest({"NCCL_SOCKET_IFNAME": "eth0", "HOME": "/root"})
    assert list(digest) == ["NCCL_SOCKET_IFNAME"] and "eth0" not in digest["NCCL_SOCKET_IFNAME"]
    found = disagreements([card(1, env=digest), card(2, env=env_digest({"NCCL_SOCKET_IFNAME": "ib0"}))])
    assert [(d.field, d.fatal) for d in found] == [("environment", False)]


def test_two_agents_on_one_machine_are_noted() -> None:
    assert shared_machines([card(1), card(2, boot_id="boot1"), card(3)]) == [("host1 pid 1", "host2 pid 2")]


def test_launch_flags_read_torchrun_s_command_line() -> None:
    argv = ["--nnodes=2", "--nproc-per-node=3", "--max-restarts=2", "train.py", "--lr", "1"]
    assert launch_flags(argv) == (3, 2)
    assert launch_flags(["--no-such-flag"]) == (None, None)


def test_host_decision_names_what_it_compared() -> None:
    local = {"10.0.0.5"}
    decision = decide_host(
        "alias", ("10.0.0.5",), configured=None, torch_match=False, this_host="n1", binds=local.__contains__
    )
    assert decision.host and not decision.torch_says
    assert "'alias'" in decision.evidence and "10.0.0.5" in decision.evidence and "is_host=1" in decision.evidence
    other = decide_host(
        "n2", ("10.0.0.6",), configured=None, torch_match=False, this_host="n1", binds=local.__contains__
    )
    assert not other.host and "'n1'" in other.evidence
    loop = decide_host("n2", ("127.0.1.1",), configured=None, torch_match=False, this_host="n1", binds=lambda _: True)
    assert not loop.host  # a loopback address binds everywhere: never proof of being the host
    forced = decide_host("n2", (), configured=True, torch_match=False, this_host="n1", binds=local.__contains__)
    assert forced.host and "is_host=1" in forced.evidence


def _snapshot(**changes: object) -> Snapshot:
    base: dict[str, object] = {
        "run_id": "job",
        "endpoint": "n1:29400",
        "round": 1,
        "min_nodes": 2,
        "max_nodes": 2,
        "participants": ("node1_1_0",),
        "wait_list": (),
        "waited": 10.2,
        "join_timeout": 10.0,
        "cards": (card(1),),
        "beats": {0: 1100.0},
        "now": 1100.0,
    }
    return Snapshot(**{**base, **changes})  # type: ignore[arg-type]


def test_timeout_names_the_node_that_never_came() -> None:
    exc = explain_timeout(_snapshot())
    text = str(exc)
    assert "1 of --nnodes=2 agents came" in text and "host1 pid 1" in text and "round 1" in text
    assert "never started torchrun" in exc.why and "join_timeout" in exc.fix and "distinit doctor" in exc.fix
    assert len(text.splitlines()) <= 20


def test_timeout_names_the_agent_that_stopped() -> None:
    exc = explain_timeout(_snapshot(cards=(card(1), card(2)), beats={0: 1100.0, 1: 1050.0}))
    assert "seen, then stopped heart-beating: host2 pid 2" in str(exc)
    assert "host2" in exc.why and exc.lost == ("host2 pid 2",)


def test_a_card_outside_torch_s_round_never_fails_it() -> None:
    own, peer = card(1), card(2)
    forged = card(9, torch="9.9.9")  # any store client can write one, e.g. with a beat of 1e18
    other_job = card(8, run_id="other")
    participants = ("node1_1_0", "node2_2_0")
    members, foreign = round_cards(
        own, [(peer, "fresh"), (forged, "future"), (other_job, "fresh")], participants, formed=True
    )
    assert members == [own, peer] and foreign == [forged]
    assert not [d for d in disagreements(members) if d.fatal]
    # A fresh forged card of this job, not in torch's round: foreign once the round formed, ignored before.
    assert round_cards(own, [(forged, "fresh")], participants, formed=True) == ([own], [forged])
    assert round_cards(own, [(forged, "fresh")], participants, formed=False) == ([own], [])
    # ... unless torch lists it as waiting for the next round (an elastic job's late agent).
    assert round_cards(own, [(forged, "fresh")], participants, formed=True, waiting=("node9_9_0",)) == ([own], [])


def test_a_forged_claim_on_a_participant_or_on_this_agent_is_foreign() -> None:
    own, peer = card(1), card(2)
    impostor = card(2, torch="9.9.9")  # names peer's node and pid
    participants = ("node1_1_0", "node2_2_0")
    members, foreign = round_cards(own, [(peer, "fresh"), (impostor, "fresh")], participants, formed=False)
    assert members == [own] and foreign == [peer, impostor]  # two claims on one agent: neither is trusted
    members, foreign = round_cards(own, [(card(1, torch="9.9.9"), "fresh")], participants, formed=False)
    assert members == [own] and len(foreign) == 1
    stale, mismatching = card(3, torch="9.9.9"), card(2, max_restarts=3)
    members, foreign = round_cards(own, [(stale, "stale"), (mismatching, "fresh")], participants, formed=False)
    assert members == [own, mismatching] and foreign == []  # a participant's own card does fail the round
    assert [d.field for d in disagreements(members) if d.fatal] == ["--max-restarts"]


def test_a_lost_store_names_the_agent_that_hosted_it() -> None:
    host, other = card(2, store_host=True), card(3)
    exc = explain_lost("n2:29400", card(1), [host, other], round_=0, waiting=True)
    text = f"{exc}\n{exc.why}\n{exc.fix}"
    assert exc.kind == "lost" and isinstance(exc, RendezvousConnectionError)
    assert "stopped answering" in text and "the agent hosting it, host2 pid 2" in text and "left" in text
    assert "came before: host3 pid 3" in text and "on host2" in exc.fix
    assert "never started" not in text
    unknown = explain_lost("n2:29400", card(1), [other], round_=1, waiting=False)
    assert "the endpoint's node" in unknown.why and "never started" not in str(unknown)


def test_errors_are_torch_s_and_ours_and_pickle() -> None:
    exc = explain_timeout(_snapshot())
    assert isinstance(exc, RendezvousTimeoutError) and isinstance(exc, distinit.DistinitError)
    assert isinstance(AgentRendezvousConnectionError("x"), RendezvousConnectionError)
    for err in (exc, AgentConfigMismatchError("what", why="w", fix="f")):
        for clone in (pickle.loads(pickle.dumps(err)), copy.copy(err)):
            assert type(clone) is type(err) and str(clone) == str(err)
    assert type(exc).__module__ == "distinit.rendezvous" and isinstance(exc, AgentRendezvousTimeoutError)


def test_the_entry_point_is_light() -> None:
    # torch imports the entry point into every torchrun agent, whatever --rdzv-backend: only the errors and the
    # entry module load at import time (no pydantic, no distinit.init: about 0.3 s on a loaded machine).
    import ast
    from pathlib import Path

    package = Path(distinit.__file__).parent / "rendezvous"
    for name in ("__init__.py", "_entry.py", "_errors.py"):
        tree = ast.parse((package / name).read_text())
        top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        modules = {alias.name for node in top if isinstance(node, ast.Import) for alias in node.names}
        modules |= {node.module or "" for node in top if isinstance(node, ast.ImportFrom)}
        heavy = {m for m in modules if m.startswith(("pydantic", "distinit.init", "distinit.rendezvous._handler"))}
        assert not heavy, f"{name} imports {heavy} at import time"


def test_the_handler_loads_no_pydantic() -> None:
    # Issue 35: pydantic's first model costs an agent about 0.3 s of CPU, more than the rest of the happy path;
    # the handler's records are dataclasses checked by _wire. No module of the package imports pydantic (nor
    # _identity, which does), lazily or not.
    import ast
    from pathlib import Path

    package = Path(distinit.__file__).parent / "rendezvous"
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        heavy = {m for m in modules if m.startswith(("pydantic", "distinit._identity"))}
        assert not heavy, f"{path.name} imports {heavy}"


def test_a_card_round_trips_and_a_malformed_one_is_refused_by_field() -> None:
    one = card(1, addresses=("10.0.0.1",), env={"NCCL_X": "abc"}, status="joined", round=3)
    assert AgentCard.from_json(one.to_json()) == one
    assert AgentCard.from_json(one.to_json().encode()) == one  # the store hands bytes
    newer = {**json.loads(one.to_json()), "a_field_of_a_newer_distinit": [1, 2]}
    assert AgentCard.from_object(newer) == one  # unknown keys are ignored
    for key, bad in [
        ("pid", "12"),  # pydantic's lax mode took a numeric string; a card never holds one
        ("pid", True),
        ("pid", 1.5),
        ("status", "gone"),
        ("addresses", [1]),
        ("env", {"NCCL_X": 1}),
        ("boot_id", 7),
        ("store_host", 1),
    ]:
        with pytest.raises(ValueError, match=rf"AgentCard\.{key}:"):
            AgentCard.from_object({**json.loads(one.to_json()), key: bad})
    assert AgentCard.from_object({**json.loads(one.to_json()), "started": 5}).started == 5  # an int is a float
    without = json.loads(one.to_json())
    del without["run_id"]
    for text, why in [
        (json.dumps(without), "run_id"),
        ("[]", "JSON object"),
        ("not json", "Expecting value"),
    ]:
        with pytest.raises(ValueError, match=why):
            AgentCard.from_json(text)
    with pytest.raises(ValueError, match=r"AgentCard\.round:"):
        one.with_status("waiting", "4")  # type: ignore[arg-type]


def test_the_card_reads_the_machine_as_host_identity_does() -> None:
    identity = local_identity({})
    assert machine() == (identity.boot_id, identity.netns)
