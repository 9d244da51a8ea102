"""Many clients arming fast: nothing raises, nothing is lost, every final overrun is enforced."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from wd_helpers import Workers, read_events, read_json_line, wait_for

from distinit.watchdog import WatchdogServer

CLIENTS = 16  # the full 100 x 10 000 runs in benchmarks/bench_watchdog.py
ARMS = 5000


@pytest.mark.timeout(120)
def test_many_clients_arm_without_errors_or_losses(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    procs = [workers.spawn(server.env(), "load", "1.0", str(ARMS)) for _ in range(CLIENTS)]
    reports = [read_json_line(proc, 60) for proc in procs]
    assert all(r["registered"] for r in reports)
    assert sum(r["errors"] for r in reports) == 0
    assert sum(r["overflows"] for r in reports) == 0
    for proc in procs:
        assert proc.wait(30) in (-signal.SIGTERM, -signal.SIGKILL)
    pids = {p.pid for p in procs}

    def all_expired() -> list[dict[str, object]]:
        found = [e for e in read_events(events_file) if e["event"] == "watchdog.expired" and e["pid"] in pids]
        return found if len(found) == CLIENTS else []

    expired = wait_for(all_expired, 10, f"{CLIENTS} expired events")
    assert {e["scope"] for e in expired} == {"final"}  # not one of the 80 000 "load" regions
    assert {e["outcome"] for e in expired} == {"killed"}
