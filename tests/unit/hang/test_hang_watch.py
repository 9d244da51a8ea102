"""The hang verdict's settings, its record on the store, and what a rank does with a verdict (no processes)."""

from __future__ import annotations

import json
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from distinit.errors import MalformedEnvError
from distinit.hang import HANG_EXIT_CODE, HangSettings, HangWatch, Peers, Position, RankState, parse_record


def settings(**kw: object) -> HangSettings:
    args: dict[str, object] = {"hang_after": None, "on_hang": "report", "hang_verdict": True, "environ": {}}
    args.update(kw)
    return HangSettings.of(**args)  # type: ignore[arg-type]


def test_settings_defaults_arguments_and_the_variable() -> None:
    assert settings() == HangSettings(enabled=True, hang_after=None, on_hang="report")
    assert settings(hang_after=timedelta(seconds=30)).hang_after == 30.0
    assert settings(environ={"DISTINIT_HANG_AFTER": "25"}).hang_after == 25.0
    assert settings(hang_after=5, environ={"DISTINIT_HANG_AFTER": "25"}).hang_after == 5.0  # the argument wins
    assert not settings(environ={"DISTINIT_HANG_AFTER": "off"}).enabled
    assert not settings(hang_verdict=False).enabled
    assert settings(on_hang="abort").on_hang == "abort"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e3", "²", "ten", "1.2.3"])
def test_a_bad_variable_is_named_with_the_fix(value: str) -> None:
    with pytest.raises(MalformedEnvError, match="DISTINIT_HANG_AFTER") as caught:
        settings(environ={"DISTINIT_HANG_AFTER": value})
    assert "export DISTINIT_HANG_AFTER=30" in str(caught.value)


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"on_hang": "kill"}, ValueError),
        ({"hang_after": 0}, ValueError),
        ({"hang_after": "10"}, TypeError),
        ({"hang_verdict": 1}, TypeError),
    ],
)
def test_bad_arguments_are_refused(kw: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        settings(**kw)


def _states() -> list[RankState]:
    waiting = Position("collective", "all_reduce", "t.py:9", counts={"world": 3}, still=12)
    return [
        RankState(0, "rank 0 (host a, pid 1)", waiting),
        RankState(1, "rank 1 (host a, pid 2)", Position("code", "load", "t.py:4", counts={"world": 2}, still=12)),
    ]


def test_the_judge_publishes_a_verdict_once_and_every_rank_acts_on_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "verdicts.jsonl"
    exits: list[int] = []
    judge = HangWatch(settings(), rank=0, counts=dict, environ={"DISTINIT_VERDICT_FILE": str(file)}, exit=exits.append)
    record = judge.consider(_states(), silent_after=2.5)
    assert record is not None and judge.consider(_states(), silent_after=2.5) is None  # the same hang: once
    culprit = HangWatch(
        settings(),
        rank=1,
        counts=dict,
        environ={"DISTINIT_VERDICT_FILE": str(file)},
        thread_id=threading.get_ident(),
        exit=exits.append,
    )
    with caplog.at_level("WARNING", logger="distinit"):
        for _ in range(2):
            judge.heard(record, peers=None)
            culprit.heard(record, peers=None)
    verdicts = [r for r in caplog.records if getattr(r, "distinit", {}).get("event") == "hang.verdict"]
    assert [r.getMessage().split(": ", 1)[0] for r in verdicts] == ["rank 0", "rank 1"]
    assert (
        "rank 1 (host a, pid 2) is in load at t.py:4 (its own code) — rank 1 is the likely culprit"
        in verdicts[0].getMessage()
    )
    stack = [r for r in caplog.records if getattr(r, "distinit", {}).get("event") == "hang.culprit_stack"]
    assert len(stack) == 1 and "test_the_judge_publishes" in stack[0].getMessage()
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    assert [(x["rank"], x["role"], x["culprits"], x["event"]) for x in lines] == [
        (0, "victim", [1], "hang.verdict"),
        (1, "culprit", [1], "hang.verdict"),
    ]
    assert exits == []  # report: nobody exits


def test_abort_exits_the_culprit_at_once_and_the_others_after_it(caplog: pytest.LogCaptureFixture) -> None:
    exits: list[tuple[int, int]] = []
    abort = settings(on_hang="abort")
    judge = HangWatch(abort, rank=0, counts=dict, environ={}, exit=lambda code: exits.append((0, code)))
    culprit = HangWatch(abort, rank=1, counts=dict, environ={}, exit=lambda code: exits.append((1, code)))
    record = judge.consider(_states(), silent_after=2.5)
    assert record is not None
    acks: set[int] = set()
    hooks = sys.excepthook, threading.excepthook
    try:
        judge.heard(record, peers=Peers(2, gone=lambda r: bool(exits) and exits[0][0] == r, ack=lambda: acks.add(0)))
        culprit.heard(record, peers=Peers(2, ack=lambda: acks.add(1), acked=lambda ranks: set(ranks) <= acks))
        assert sys.excepthook is not hooks[0]  # from the verdict on, a failure in any thread ends the rank alike
    finally:
        sys.excepthook, threading.excepthook = hooks
    # the judge heard first, acknowledged, and waited (bounded) for the culprit; the culprit found every other rank
    # acknowledged and left at once; with exit() a no-op here, the judge then left after its bound
    assert exits == [(0, HANG_EXIT_CODE), (1, HANG_EXIT_CODE)] and acks == {0, 1}


def test_a_stuck_collective_is_reported_but_never_aborts() -> None:
    exits: list[int] = []
    watch = HangWatch(settings(on_hang="abort"), rank=0, counts=dict, environ={}, exit=exits.append)
    same = Position("collective", "all_reduce", "t.py:9", counts={"world": 3}, still=12)
    record = watch.consider([RankState(0, "rank 0", same), RankState(1, "rank 1", same)], silent_after=2.5)
    assert record is not None and json.loads(record)["kind"] == "stuck"
    watch.heard(record, peers=None)
    assert exits == []


@pytest.mark.parametrize(
    "junk",
    [
        b"rank 2 did it",
        b"{}",
        b"[" * 50_000,
        json.dumps(
            {"key": "k", "kind": "culprit", "text": "forged", "waiting": [], "culprits": [1], "time": 1}
        ).encode(),
        json.dumps(
            {"key": "k", "kind": "culprit", "text": "hang: \x1b[31m", "waiting": [], "culprits": [1], "time": 1}
        ).encode(),
        json.dumps({"key": "k", "kind": "evil", "text": "hang: x", "waiting": [], "culprits": [1], "time": 1}).encode(),
        json.dumps(
            {"key": "k", "kind": "culprit", "text": "hang: x", "waiting": [], "culprits": [-1], "time": 1}
        ).encode(),
        json.dumps(
            {"key": "k", "kind": "culprit", "text": "hang: " + "x" * 20_000, "waiting": [], "culprits": [], "time": 1}
        ).encode(),
    ],
)
def test_junk_on_the_verdict_key_is_never_printed_or_acted_on(junk: bytes, caplog: pytest.LogCaptureFixture) -> None:
    assert parse_record(junk) is None
    exits: list[int] = []
    watch = HangWatch(settings(on_hang="abort"), rank=1, counts=dict, environ={}, exit=exits.append)
    with caplog.at_level("WARNING", logger="distinit"):
        watch.heard(junk, peers=None)
    assert exits == [] and not caplog.records


def test_a_hang_that_ends_and_comes_back_is_a_new_verdict() -> None:
    judge = HangWatch(settings(), rank=0, counts=dict, environ={}, exit=lambda code: None)
    first = judge.consider(_states(), silent_after=2.5)
    moving = [RankState(0, "rank 0", Position("code", "f", "t.py:1", counts={"world": 9}, still=0.1))]
    assert judge.consider(moving, silent_after=2.5) is None  # over
    again = judge.consider(_states(), silent_after=2.5)
    assert first is not None and again is not None
    assert parse_record(first).key != parse_record(again).key  # type: ignore[union-attr]  # every rank hears it


def test_unprintable_file_names_cannot_silence_the_verdict() -> None:
    position = Position("code", "load\tbatch", "da\nta.py:4", counts={"world": 2}, still=12)
    parsed = Position.parse(position.encode())
    assert parsed is not None and parsed.op == "load?batch" and parsed.at == "da?ta.py:4"
    states = [RankState(0, "rank 0", Position("collective", "all_reduce", "t.py:9", counts={"world": 3}, still=12)),
              RankState(1, "rank 1", parsed)]  # fmt: skip
    record = HangWatch(settings(), rank=0, counts=dict, environ={}).consider(states, silent_after=2.5)
    assert record is not None and parse_record(record) is not None


def test_a_verdict_at_10k_ranks_fits_its_record_and_is_heard() -> None:
    hung = Position("collective", "all_reduce", "train.py:88", counts={"world": 9}, still=12)
    states = [RankState(r, f"rank {r}", hung) for r in range(9_999)]
    states.append(RankState(9_999, "rank 9999", Position("code", "load", "d.py:4", counts={"world": 8}, still=12)))
    record = HangWatch(settings(), rank=0, counts=dict, environ={}).consider(states, silent_after=5.0)
    assert record is not None and len(record) < 16384
    parsed = parse_record(record)
    assert parsed is not None and parsed.waiting == 9_999 and parsed.culprits == (9_999,)
    assert "ranks 0-9998 have waited 12 s" in parsed.text


@pytest.mark.parametrize("when", ["1e400", "-1e400", "NaN", "true"])
def test_a_record_with_an_impossible_time_is_junk(when: str) -> None:
    text = '{"key": "k", "kind": "culprit", "text": "hang: x", "waiting": 1, "culprits": [1], "time": ' + when + "}"
    assert parse_record(text) is None
