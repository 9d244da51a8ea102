"""The judgement after setup(): which rank stopped first, from facts alone (pure; no store, no processes)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distinit.errors import RankLostError
from distinit.init._liveness import (
    ExitRecord,
    RankFacts,
    State,
    _plausible_who,
    _wall,
    consequence,
    is_finding,
    judge,
    unsettled,
)

T = 1_800_000_000.0  # a wall clock
MARGIN = 1.5  # one beat and half a second


def facts(rank: int, state: State, last: float | None, record: ExitRecord | None = None) -> RankFacts:
    return RankFacts(rank, f"rank {rank} (host h{rank // 2}, pid {100 + rank})", state, last, record)


def peer(at: float) -> ExitRecord:
    return ExitRecord("peer", at, "Connection closed by peer")


def test_the_one_rank_that_stopped_is_named_and_the_consequences_are_said_to_be_such() -> None:
    found = judge(
        [facts(0, "beating", T + 3, peer(T + 0.1)), facts(1, "gone", T), facts(2, "bye", None, peer(T + 0.2))],
        margin=MARGIN,
    )
    assert found.culprit == 1
    assert found.text.startswith("rank 1 (host h0, pid 101): its process is gone")
    assert "consequences (left because a collective failed on a peer): rank 0, 2" in found.text


def test_a_silent_rank_on_another_host_is_named_with_what_is_known() -> None:
    found = judge([facts(0, "beating", T + 3), facts(3, "silent", T)], margin=MARGIN)
    assert found.culprit == 3
    assert "no heartbeat since then and no exit record" in found.text


def test_a_rank_that_raised_is_named_with_its_exception_even_while_it_still_beats() -> None:
    raised = ExitRecord("error", T, "ValueError: a bug")
    found = judge([facts(1, "beating", T + 1, raised), facts(2, "bye", None, peer(T + 0.5))], margin=MARGIN)
    assert found.culprit == 1
    assert "it raised ValueError: a bug" in found.text


def test_a_rank_that_left_normally_while_the_others_were_in_a_collective_is_named() -> None:
    found = judge([facts(0, "beating", T + 3), facts(2, "bye", None)], margin=MARGIN)
    assert found.culprit == 2
    assert "left without an error" in found.text


def test_of_two_stopped_ranks_the_first_is_named_only_when_clearly_first() -> None:
    clear = judge([facts(1, "gone", T), facts(3, "silent", T + 3.0)], margin=MARGIN)
    assert clear.culprit == 1 and "It stopped first; later: rank 3" in clear.text
    close = judge([facts(1, "gone", T + 0.4), facts(3, "silent", T)], margin=MARGIN)
    assert close.culprit is None
    assert close.text.startswith("unknown: 2 ranks stopped within 1.5 s of each other")
    assert "rank 1 (host h0, pid 101)" in close.text and "rank 3 (host h1, pid 103)" in close.text


def test_only_a_silence_deciding_between_stopped_ranks_is_watched_longer() -> None:
    # a beat stopped for two beats may be a starved thread: it must not decide between this and a dead rank
    assert unsettled([facts(1, "gone", T), facts(3, "silent", T + 0.5)])
    assert unsettled([facts(1, "silent", T), facts(3, "silent", T + 3.0)])
    # one stopped rank, or several whose ends are facts (gone here, bye, an error record), is settled
    assert not unsettled([facts(0, "beating", T + 3), facts(3, "silent", T)])
    assert not unsettled([facts(1, "gone", T), facts(2, "bye", None), facts(3, "beating", T + 2)])
    raised = ExitRecord("error", T, "ValueError: a bug")
    assert not unsettled([facts(1, "gone", T), facts(3, "beating", T + 1, raised)])
    # a silent consequence is no candidate, and a silent rank that left an error record is a fact
    assert not unsettled([facts(1, "gone", T), facts(3, "silent", T, peer(T + 0.1))])
    assert not unsettled([facts(1, "gone", T), facts(3, "silent", T, raised)])


def test_a_stop_time_unknown_never_decides_the_order() -> None:
    found = judge([facts(1, "gone", None), facts(3, "silent", T)], margin=MARGIN)
    assert found.culprit is None and found.text.startswith("unknown")


def test_nobody_stopped_is_unknown_never_a_live_rank() -> None:
    found = judge([facts(0, "beating", T), facts(1, "beating", T, peer(T))], margin=MARGIN)
    assert found.culprit is None
    assert found.text.startswith("unknown: no rank stopped beating")
    assert "rank 0 (" not in found.text


def test_consequences_are_never_culprits_even_when_they_stopped_first() -> None:
    found = judge([facts(1, "gone", T + 2, None), facts(2, "silent", T, peer(T))], margin=MARGIN)
    assert found.culprit == 1


@pytest.mark.parametrize(
    "value",
    [b"peer|1800000000.5|Connection closed", b"error|1800000000.500|ValueError: x|y"],
)
def test_exit_records_round_trip(value: bytes) -> None:
    record = ExitRecord.parse(value)
    assert record is not None
    assert ExitRecord.parse(record.encode()) == record


@pytest.mark.parametrize("value", [b"", b"bye", b"peer|soon|x", b"other|1.0|x", b"\xff\xfe"])
def test_what_is_not_an_exit_record_is_none(value: bytes) -> None:
    assert ExitRecord.parse(value) is None


def test_the_wall_clock_of_a_beat_ignores_rank_0s_mark() -> None:
    assert _wall(b"12|1800000000.250|lost") == 1800000000.25
    assert _wall(b"12|1800000000.250") == 1800000000.25
    assert _wall(b"bye") is None and _wall(b"1|x") is None


def test_what_counts_as_a_consequence() -> None:
    closed = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:7582")
    assert consequence(closed)
    assert consequence(dist.DistBackendError("Timed out waiting 1800000ms for recv operation to complete"))
    assert consequence(RankLostError("rank 2 went away", rank=0, why="w", fix="f"))
    wrapped = ValueError("the step failed")
    wrapped.__cause__ = closed
    assert consequence(wrapped)
    assert not consequence(ValueError("a bug in the user's code"))
    assert not consequence(RuntimeError("CUDA out of memory"))
    assert not consequence(None)


def test_only_what_judge_words_is_taken_for_a_finding() -> None:
    # every shape judge() and the store-gone path word is one; junk any store client writes is not
    for found in (
        judge([facts(1, "gone", T)], margin=MARGIN),
        judge([facts(1, "gone", T), facts(3, "silent", T + 0.2)], margin=MARGIN),
        judge([facts(0, "beating", T)], margin=MARGIN),
    ):
        assert is_finding(found.text), found.text
    assert is_finding("rank 0: the store host is gone (its process is gone) and left no finding or exit record")
    assert is_finding("rank 0 (host h, pid 1): the store host is gone")
    for junk in (
        "",
        "x",
        "\x1b[31mrank 2 did it",
        "rank 2 did it\x00",
        "rank two",
        "ranks 1",
        "rank 1\nforged",
        "unknown",
    ):
        assert not is_finding(junk), junk
    assert not is_finding("unknown: " + "x" * (1 << 16))


def test_a_who_value_is_a_host_name_and_a_decimal_pid() -> None:
    assert _plausible_who("gpu-b.cluster", "902") and _plausible_who("hôte-ü", "1")
    for host, pid in (("", "1"), ("h h", "1"), ("h\x1b[31m", "1"), ("h", "12a"), ("h", "٣"), ("h" * 256, "1")):
        assert not _plausible_who(host, pid), (host, pid)
