"""The hang verdict as a pure function of what the ranks published (distinit.hang.judge): every rule, by table."""

from __future__ import annotations

import math

import pytest

from distinit.hang import DEFAULT_HANG_AFTER, HangVerdict, Position, RankState, judge, threshold

SILENT = 2.5


def coll(op: str = "all_reduce", at: str = "train.py:88", n: int | None = 5, still: float = 12.0) -> Position:
    return Position("collective", op, at, counts={} if n is None else {"world": n}, still=still)


def code(
    fn: str = "load_batch", at: str = "data.py:41", n: int | None = 4, still: float = 12.0, own: str = ""
) -> Position:
    return Position("code", fn, at, own=own, counts={} if n is None else {"world": n}, still=still)


def st(rank: int, position: Position | None, silent: float = 0.0, process: str = "") -> RankState:
    return RankState(
        rank, f"rank {rank} (host h{rank}, pid {100 + rank})", position, silent_for=silent, process=process
    )


def verdict(*states: RankState, limit: float = 10.0) -> HangVerdict | None:
    return judge(states, threshold=limit, silent_after=SILENT)


def test_the_issue_example_names_the_rank_in_its_own_code() -> None:
    v = verdict(st(0, coll()), st(1, coll()), st(2, code()), st(3, coll()))
    assert v is not None and v.kind == "culprit" and v.culprits == (2,) and v.waiting == (0, 1, 3)
    assert v.text == (
        "hang: ranks 0,1,3 have waited 12 s in all_reduce #5 at train.py:88; rank 2 (host h2, pid 102) is in "
        "load_batch at data.py:41 (its own code) — rank 2 is the likely culprit"
    )
    assert v.stops_the_job


def test_no_verdict_before_the_threshold() -> None:
    assert verdict(st(0, coll(still=9.9)), st(1, coll(still=9.9)), st(2, code())) is None


def test_no_verdict_while_every_rank_is_in_its_own_code() -> None:
    assert verdict(st(0, code(n=5)), st(1, code(n=5)), st(2, code(n=5))) is None


def test_a_rank_that_arrived_later_waits_too() -> None:
    v = verdict(st(0, coll()), st(1, coll(still=1.0)), st(2, code()))
    assert v is not None and v.waiting == (0, 1) and v.culprits == (2,)


@pytest.mark.parametrize(
    ("process", "words"),
    [
        ("stopped", "its process is stopped (state T: SIGSTOP, a debugger or job control)"),
        ("running", "its process runs but its liveness thread cannot (a C call holding the GIL?)"),
        ("gone", "its process is gone"),
        ("disk", "its process is in uninterruptible sleep (state D: waiting on a filesystem or a device)"),
        ("", "frozen, holding the GIL, or cut off from the store"),
    ],
)
def test_a_silent_rank_is_named_with_what_its_process_does(process: str, words: str) -> None:
    # its last position (published before it froze) is stale: not used
    v = verdict(st(0, coll()), st(1, coll()), st(2, code(n=5), silent=11.0, process=process))
    assert v is not None and v.culprits == (2,)
    assert f"rank 2 (host h2, pid 102) has not beaten for 11 s: {words} — rank 2 is the likely culprit" in v.text


def test_a_rank_that_left_through_teardown_is_named_so() -> None:
    v = verdict(st(0, coll()), st(1, coll()), st(2, code(), silent=math.inf, process="left"))
    assert v is not None and v.culprits == (2,) and "rank 2 (host h2, pid 102) left through teardown()" in v.text


def test_a_rank_without_a_fresh_position_is_unknown_and_never_named() -> None:
    # its hang verdict is off (DISTINIT_HANG_AFTER=off on that node), or failed: it beats, its position is old
    for state in (st(2, None), st(2, code(), process="nopos")):
        v = verdict(st(0, coll()), st(1, coll()), state)
        assert v is not None and v.kind == "unknown" and v.culprits == () and not v.stops_the_job
        assert "publishes no fresh position (its hang verdict is off or failed)" in v.text
        assert "no culprit can be named" in v.text


def test_different_calls_with_nobody_missing_are_a_mismatch_naming_both_sites() -> None:
    v = verdict(
        st(0, coll()), st(1, coll()), st(2, coll("broadcast", "train.py:90")), st(3, coll("broadcast", "train.py:90"))
    )
    assert v is not None and v.kind == "mismatch" and v.culprits == () and v.stops_the_job
    assert v.text == (
        "hang: ranks 0,1 have waited 12 s in all_reduce #5 at train.py:88; ranks 2,3 have waited 12 s in broadcast "
        "#5 at train.py:90 — the ranks called different collectives (a desync); no rank is missing"
    )


def test_a_rank_in_another_collective_is_a_mismatch_once_it_waited_too() -> None:
    assert verdict(st(0, coll()), st(1, coll()), st(2, coll("barrier", "eval.py:3", still=4.0))) is None  # not yet
    v = verdict(st(0, coll()), st(1, coll()), st(2, coll("barrier", "eval.py:3", still=10.0)))
    assert v is not None and v.kind == "mismatch"
    assert "rank 2 has waited 10 s in barrier #5 at eval.py:3" in v.text


def test_a_rank_that_just_arrived_in_the_same_call_defers_stuck() -> None:
    # the rank that was holding the others up comes: no "stuck" verdict while the call may now complete
    assert verdict(st(0, coll()), st(1, coll()), st(2, coll(still=0.5))) is None


def test_every_rank_in_the_same_call_is_stuck_and_never_stops_the_job() -> None:
    v = verdict(st(0, coll()), st(1, coll()), st(2, coll()))
    assert v is not None and v.kind == "stuck" and v.culprits == () and not v.stops_the_job
    assert "none is missing" in v.text and "no culprit" in v.text


def test_a_rank_elsewhere_that_already_issued_the_collective_is_not_a_suspect() -> None:
    # an asynchronous all_reduce issued (its count is the waiting ranks'), now in its own code: not waited for
    v = verdict(st(0, coll()), st(1, coll()), st(2, code(n=5)))
    assert v is not None and v.culprits == () and v.kind == "stuck"
    assert (
        "rank 2 (host h2, pid 102) has issued #5 and is in load_batch at data.py:41 (its own code) (not waited for)"
        in v.text
    )


def test_numbers_are_quoted_only_when_they_identify_the_call() -> None:
    v = verdict(st(0, coll(n=5)), st(1, coll(n=6)), st(2, code()))
    assert v is not None and "all_reduce at" in v.text and "#" not in v.text.split(";")[0]


def test_with_several_groups_and_the_call_s_group_unknown_nobody_is_named() -> None:
    several = Position("collective", "all_reduce", "t.py:1", counts={"world": 5, "pg1": 3}, still=12)
    v = verdict(st(0, several), st(1, several), st(2, code(n=None)))
    assert v is not None and v.kind == "unknown" and v.culprits == () and "#" not in v.text


def test_on_a_sub_group_only_its_members_can_be_named() -> None:
    # ranks 0,1 wait on group "g1" = {0,1,2}; rank 2 (a member, behind) is named; rank 3 (not a member) is not
    wait = Position("collective", "all_reduce", "t.py:1", counts={"world": 5, "g1": 3}, still=12, group="g1")
    behind = Position("code", "load_batch", "d.py:4", counts={"world": 5, "g1": 2}, still=12)
    bystander = Position("code", "evaluate", "e.py:9", counts={"world": 5}, still=12)
    v = verdict(st(0, wait), st(1, wait), st(2, behind), st(3, bystander))
    assert v is not None and v.culprits == (2,), v
    assert "all_reduce #3 at t.py:1" in v.text and "rank 3 (host h3, pid 103) is not in that call's group" in v.text


def test_a_silent_rank_last_seen_in_the_waiting_call_waits_too() -> None:
    # rank 0's liveness thread is starved: its beat stops, its last position says it waits with the others
    v = verdict(st(0, coll(), silent=4.0), st(1, coll()), st(2, code()))
    assert v is not None and v.culprits == (2,) and v.waiting == (0, 1)
    assert "rank 0 last seen waiting there too" in v.text


def test_the_asynchronous_case_names_the_rank_that_issued_fewer_collectives() -> None:
    # NCCL: every rank waits in its own code (.item()); the counts say who did not issue collective #5
    wait = code("step", "train.py:95", n=5)
    v = verdict(st(0, wait), st(1, wait), st(2, code(n=4)), st(3, wait))
    assert v is not None and v.kind == "culprit" and v.culprits == (2,) and v.waiting == (0, 1, 3)
    assert v.text.startswith(
        "hang: ranks 0,1,3 issued collective #5 and have waited 12 s since, in step at train.py:95"
    )
    assert "rank 2 (host h2, pid 102) has issued #4 only and is in load_batch at data.py:41" in v.text


def test_the_asynchronous_case_names_nobody_waiting_where_the_ranks_ahead_wait() -> None:
    # point-to-point ops count too: rank 2 did one send fewer but waits in the same .item() as ranks 0 and 1
    wait = code("step", "train.py:95", n=6)
    v = verdict(st(0, wait), st(1, wait), st(2, code("step", "train.py:95", n=5)), st(3, code(n=4)))
    assert v is None  # three counts: nothing decides
    v = verdict(st(0, wait), st(1, wait), st(2, code("step", "train.py:95", n=5)))
    assert v is None  # the rank behind waits where the others wait


def test_the_asynchronous_case_needs_every_rank_still_and_one_group() -> None:
    wait = code("step", "train.py:95", n=5)
    assert verdict(st(0, wait), st(1, code(n=4, still=3.0))) is None  # rank 1 moves
    multi = Position("code", "step", "t.py:1", counts={"world": 5, "pg": 2}, still=12)
    assert verdict(st(0, multi), st(1, code(n=4))) is None  # several groups: counts do not compare
    assert verdict(st(0, wait), st(1, wait)) is None  # every rank issued as many


def test_the_same_hang_judged_twice_has_the_same_key_and_a_new_culprit_a_new_one() -> None:
    a = verdict(st(0, coll(still=12)), st(1, code()))
    b = verdict(st(0, coll(still=20)), st(1, code(still=25)))
    c = verdict(st(0, coll(still=20)), st(1, code(), silent=5.0))
    assert a is not None and b is not None and c is not None
    assert a.key == b.key and a.text != b.text
    assert c.key == a.key  # same culprit, same call: not a new verdict


def test_many_suspects_are_counted_past_eight() -> None:
    states = [st(0, coll())] + [st(r, code()) for r in range(1, 12)]
    v = verdict(*states)
    assert v is not None and "and 3 more" in v.text and "ranks 1-11 are the likely culprits" in v.text


def test_threshold_grows_with_a_slow_loop_unless_given() -> None:
    slow = Position("code", "f", "a.py:1", gap=30.0)
    assert threshold(None, [None, Position("code", "f", "a.py:1")]) == DEFAULT_HANG_AFTER
    assert threshold(None, [slow, Position("code", "f", "a.py:1", gap=1.0)]) == 60.0
    assert threshold(4.0, [slow]) == 4.0
