"""What a peer sends is validated before anything reads it: every bad document is named with its cause."""

from __future__ import annotations

import json
from typing import Any

import pytest

from distinit.doctor import Check
from distinit.doctor._merge import unformed_world
from distinit.doctor._peer import PeerDocument, PeerLocal, PeerResults, parse_document, parse_local, parse_results

HONEST: dict[str, Any] = {
    "claim": {"rank": 1, "identity": {"hostname": "b"}},
    "facts": {"versions": {"torch": "2.13.0"}, "backends": {"gloo": True}, "variables": {}, "digest": "0"},
    "local": [],
    "cuda_device": None,
    "endpoint": ["10.0.0.2", 40000],
}


def test_an_honest_document_validates() -> None:
    assert isinstance(parse_document(json.dumps(HONEST).encode(), rank=1, world_size=2), PeerDocument)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        pytest.param(None, "announced a document size out of bounds", id="size-out-of-bounds"),
        pytest.param(b"[" * 50_000 + b"]" * 50_000, "recursion limit exceeded", id="nested-50k"),
        pytest.param(b"\xff\xfe", "Invalid JSON", id="not-json"),
        pytest.param(json.dumps([1, 2]).encode(), "the document: Input should be an object", id="a-list"),
        pytest.param(json.dumps({**HONEST, "facts": []}).encode(), "facts: Input should be an object", id="facts-list"),
        pytest.param(
            json.dumps({**HONEST, "local": "ok"}).encode(), "local: Input should be a valid array", id="local-str"
        ),
        pytest.param(json.dumps({**HONEST, "endpoint": ["a", 10**12]}).encode(), "endpoint.1", id="port-10e12"),
        pytest.param(json.dumps({**HONEST, "extra": 1}).encode(), "extra: Extra inputs are not permitted", id="extra"),
        pytest.param(
            json.dumps({**HONEST, "claim": {"rank": 5, "identity": {"hostname": "b"}}}).encode(),
            "claims rank 5 in a world of 2",
            id="rank-outside-world",
        ),
        pytest.param(
            json.dumps({**HONEST, "claim": {"rank": 1, "identity": {"hostname": "h" * 300}}}).encode(),
            "hostname is longer than 255",
            id="hostname-300",
        ),
        pytest.param(
            json.dumps({**HONEST, "local": [{"id": "world", "status": "pass", "summary": "x"}]}).encode(),
            "not a local check id",
            id="world-as-local",
        ),
    ],
)
def test_a_bad_document_is_named_with_its_real_cause(raw: bytes | None, said: str) -> None:
    found = parse_document(raw, rank=1, world_size=2)
    assert isinstance(found, str) and said in found, found


def test_results_and_local_checks_are_validated_too() -> None:
    assert "clock" in str(parse_results(json.dumps({"clock": [1.0, -2.0]}).encode()))
    assert isinstance(parse_results(json.dumps({"clock": "refused"}).encode()), PeerResults)
    mine = PeerLocal(rank=2, host="c", local=(Check(id="shm", status="fail", summary="1 MiB"),))
    assert parse_local(mine.model_dump_json().encode(), rank=2) == mine
    assert parse_local(mine.model_dump_json().encode(), rank=3) == "sent the local checks of rank 2"
    assert "do not validate" in str(parse_local(b'{"rank": 3, "host": [], "local": []}', rank=3))


def test_an_unformed_world_merges_the_local_checks_that_arrived() -> None:
    world = Check(id="world", status="fail", summary="missing ranks [3]")
    shared = {
        0: PeerLocal(rank=0, host="a", local=(Check(id="shm", status="pass", summary="ok"),)),
        1: PeerLocal(rank=1, host="b", local=(Check(id="shm", status="fail", summary="1 MiB"),)),
        2: "sent local checks that do not validate: host: Input should be a valid string",
    }
    shown, shm = unformed_world(world, shared)
    assert shown.evidence["merged_ranks"] == [0, 1] and "2" in shown.evidence["unusable_local_checks"]
    assert shm.status == "fail" and shm.ranks == (1,) and shm.summary == "rank 1 (b): 1 MiB"
