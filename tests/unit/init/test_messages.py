"""Pure tests of the rendezvous error messages: facts as attributes, what/why/fix, verdict round trip."""

from __future__ import annotations

import copy
import pickle

import pytest

from distinit.errors import (
    DuplicateRankError,
    MasterUnreachableError,
    PortInUseError,
    RendezvousError,
    RendezvousTimeoutError,
    WorldSizeMismatchError,
)
from distinit.init import _messages
from distinit.init._liveness import peer_closed


def test_duplicate_rank_names_both_claimants() -> None:
    exc = _messages.duplicate_rank(
        rank=3, master="10.0.0.1:29500", generation=0, first="gpu-a pid 811", second="gpu-b pid 902", local_rank=3
    )
    assert isinstance(exc, DuplicateRankError)
    assert exc.ranks == (3,) and exc.claimants == ("gpu-a pid 811", "gpu-b pid 902")
    text = str(exc)
    assert "rank 3 was claimed twice at rendezvous 10.0.0.1:29500" in text
    assert "gpu-a pid 811" in text and "gpu-b pid 902" in text
    assert "\n  why: " in text and "\n  fix: " in text


def test_world_size_mismatch_says_who_says_what() -> None:
    exc = _messages.world_size_mismatch(
        master="h:1", generation=0, first=(0, 3, "a pid 1"), second=(1, 2, "b pid 2"), local_rank=1
    )
    assert isinstance(exc, WorldSizeMismatchError)
    assert "rank 1 says 2" in exc.what and "rank 0 says 3" in exc.what
    assert exc.ranks == (0, 1)


def test_rendezvous_timeout_lists_missing_ranks_and_attempts() -> None:
    exc = _messages.rendezvous_timeout(
        rank=0,
        world_size=4,
        master="h:1",
        deadline=60,
        missing=[2, 3],
        attempts=["#1 join 30.0 s: join: 2/4 joined", "#2 join 28.0 s: join: 2/4 joined"],
        generation=0,
    )
    assert isinstance(exc, RendezvousTimeoutError)
    assert exc.ranks == (2, 3) and len(exc.attempts) == 2
    assert "missing ranks [2, 3] of world size 4" in exc.what


def test_rendezvous_timeout_for_a_blocked_call_says_what_never_returned() -> None:
    exc = _messages.rendezvous_timeout(
        rank=1,
        world_size=2,
        master="h:1",
        deadline=8,
        missing=[],
        attempts=["#1 join 10.0 s: blocked, abandoned"],
        generation=0,
        blocked="attempt 1 blocked in join for 10.0 s",
    )
    assert isinstance(exc, RendezvousTimeoutError)
    assert "(1 attempt)" in exc.what
    assert "attempt 1 blocked in join for 10.0 s: a store or network call never returned" in exc.what
    assert "frozen" in exc.why and "h:1" in exc.fix


@pytest.mark.parametrize(
    ("exc", "cls", "needle"),
    [
        pytest.param(
            _messages.cannot_resolve(master="x:1", host="x", seconds=60, detail="gai", rank=1),
            MasterUnreachableError,
            "cannot resolve MASTER_ADDR='x'",
            id="dns",
        ),
        pytest.param(
            _messages.unroutable(master="192.0.2.1:1", seconds=10, detail="Network is unreachable", rank=1),
            MasterUnreachableError,
            "no route",
            id="no-route",
        ),
        pytest.param(_messages.black_hole(master="h:1", seconds=10, rank=1), MasterUnreachableError, "vanish", id="bh"),
        pytest.param(
            _messages.port_in_use(master="h:1", port=1, seconds=30, holder="pid 5 (nc -l 1)", rank=0),
            PortInUseError,
            "Address already in use",
            id="busy",
        ),
        pytest.param(
            _messages.foreign_listener(master="h:1", seconds=30, holder=None, rank=1),
            PortInUseError,
            "not a torch TCPStore",
            id="foreign",
        ),
        pytest.param(
            _messages.rank_out_of_range(rank=2, world_size=2),
            WorldSizeMismatchError,
            "valid ranks are 0..1",
            id="range",
        ),
        pytest.param(
            _messages.bad_interface(variable="GLOO_SOCKET_IFNAME", value="bogus0", available=["lo"], rank=0),
            RendezvousError,
            "GLOO_SOCKET_IFNAME='bogus0'",
            id="ifname",
        ),
    ],
)
def test_each_message_has_what_why_fix(exc: RendezvousError, cls: type[RendezvousError], needle: str) -> None:
    assert type(exc) is cls
    assert needle in exc.what
    assert exc.why and exc.fix


def test_errors_pickle_and_copy_with_their_facts() -> None:
    exc = _messages.duplicate_rank(rank=1, master="h:1", generation=2, first="a pid 1", second="b pid 2", local_rank=1)
    for clone in (pickle.loads(pickle.dumps(exc)), copy.copy(exc)):
        assert type(clone) is DuplicateRankError
        assert clone.claimants == exc.claimants and clone.generation == 2 and str(clone) == str(exc)


def test_verdict_round_trip_is_identical() -> None:
    exc = _messages.duplicate_rank(rank=1, master="h:1", generation=0, first="a pid 1", second="b pid 2", local_rank=1)
    again = _messages.verdict_from_json(_messages.verdict_to_json(exc), rank=0)
    assert type(again) is DuplicateRankError
    assert str(again) == str(exc) and again.claimants == exc.claimants and again.rank == 0


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param("not json", id="garbage"),
        pytest.param('{"error": "SystemExit", "what": "x"}', id="class-not-whitelisted"),
        pytest.param('{"what": "x"}', id="no-class"),
    ],
)
def test_hostile_verdicts_become_plain_rendezvous_errors(payload: str) -> None:
    exc = _messages.verdict_from_json(payload, rank=0)
    assert type(exc) is RendezvousError


SIGNED = _messages.verdict_to_json(
    _messages.rank_lost(
        rank=1, claimant="h pid 2", silent_for=6.0, last_seen="00:00:01 UTC", master="h:1", generation=0, local_rank=0
    ),
    writer=0,
    token="ab" * 8,
)


@pytest.mark.parametrize(
    ("text", "genuine"),
    [
        pytest.param(SIGNED, True, id="signed-by-rank-0"),
        pytest.param(SIGNED.replace('"token": "abab', '"token": "0000'), False, id="other-token"),
        pytest.param(SIGNED.replace('"writer": 0', '"writer": 9'), False, id="writer-out-of-range"),
        pytest.param(SIGNED.replace('"writer": 0', '"writer": true'), False, id="writer-bool"),
        pytest.param('{"error": "RankLostError", "what": "forged"}', False, id="unsigned-json"),
        pytest.param("[1, 2]", False, id="json-list"),
        pytest.param("\x00garbage", False, id="garbage"),
        pytest.param("ok", False, id="ok-is-no-verdict"),
    ],
)
def test_verdict_origin(text: str, genuine: bool) -> None:
    assert _messages.verdict_origin(text, token="ab" * 8, world_size=2) is genuine


@pytest.mark.parametrize(
    ("message", "closed"),
    [
        pytest.param("[pair.cc:553] Connection closed by peer [127.0.0.1]:7582. GLHF!", True, id="gloo-closed"),
        pytest.param("Connection reset by peer", True, id="reset"),
        pytest.param("NCCL error: remote process exited or there was a network error", True, id="nccl"),
        pytest.param("Timed out waiting 1800000ms for recv operation", False, id="timeout"),
    ],
)
def test_peer_closed(message: str, closed: bool) -> None:
    assert peer_closed(RuntimeError(message)) is closed
    assert peer_closed(ValueError(message)) is False
