from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from distinit.errors import WatchdogError
from distinit.watchdog import WatchdogEvent
from distinit.watchdog._events import EventSink, describe


def _expired() -> WatchdogEvent:
    return WatchdogEvent(
        event="watchdog.expired",
        path="/dev/shm/wd",
        pid=42,
        start_time=7,
        uid=0,
        scope="step",
        thread=1,
        after_s=1.0,
        deadline=100.0,
        overshoot_s=0.01,
        dead_after_s=0.02,
        stack_file="/dev/shm/wd/42.7.stack",
        stack="File x",
        signals=("SIGRTMIN+6", "SIGCONT", "SIGTERM"),
        outcome="killed",
        detail="died after SIGTERM",
    )


def test_event_is_frozen_and_strict() -> None:
    ev = _expired()
    with pytest.raises(ValidationError):
        ev.pid = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        WatchdogEvent(event="watchdog.expired", unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        WatchdogEvent(event="watchdog.exploded")  # type: ignore[arg-type]


def test_sink_logs_one_line_and_writes_jsonl(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "events.jsonl"
    sink = EventSink(str(path))
    with caplog.at_level(logging.DEBUG, logger="distinit.watchdog"):
        sink.emit(_expired())
    sink.close()
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "pid 42" in record.getMessage()
    assert "'step'" in record.getMessage()
    assert record.distinit["event"] == "watchdog.expired"  # type: ignore[attr-defined]
    assert "stack" not in record.distinit  # type: ignore[attr-defined]
    (line,) = path.read_text().splitlines()
    assert WatchdogEvent.model_validate(json.loads(line)).model_dump(exclude={"time"}) == _expired().model_dump(
        exclude={"time"}
    )


def test_describe_other_events() -> None:
    note = WatchdogEvent(event="watchdog.exited_armed", pid=5, scope="s")
    assert "forgotten (not killed)" in describe(note)
    assert "started server on /p" in describe(WatchdogEvent(event="watchdog.started", path="/p"))


def test_sink_appends_to_an_existing_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("earlier\n")
    path.chmod(0o600)
    sink = EventSink(str(path))
    sink.emit(_expired())
    sink.close()
    assert path.read_text().startswith("earlier\n{")


def test_sink_never_follows_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "events.jsonl"
    link.symlink_to(victim)
    with pytest.raises(WatchdogError, match="cannot open the events file"):
        EventSink(str(link))
    assert victim.read_text() == "precious\n"


@pytest.mark.timeout(10)
def test_sink_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(WatchdogError, match="cannot open the events file"):
        EventSink(str(fifo))  # no reader: a blocking open would wait for ever


def test_sink_refuses_a_file_others_may_write(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("")
    path.chmod(0o666)
    with pytest.raises(WatchdogError, match="forge"):
        EventSink(str(path))


def test_workers_are_named_by_rank_and_the_verdict_is_its_one_line_summary() -> None:
    ev = _expired().model_copy(update={"rank": 3, "local_rank": 1, "world_size": 4, "role": "victim"})
    assert describe(ev).startswith("watchdog: RANK 3 (pid 42) overran scope 'step'")
    assert json.loads(ev.model_dump_json())["role"] == "victim"
    summary = "watchdog: 4 workers expired together; likely culprit RANK 2 (pid 7), ..."
    verdict = WatchdogEvent(event="watchdog.verdict", pid=7, rank=2, role="culprit", detail=summary)
    assert describe(verdict) == summary
    with pytest.raises(ValidationError):
        WatchdogEvent(event="watchdog.verdict", role="bystander")  # type: ignore[arg-type]
