"""The long fault scenarios (late worker 40 s, master 40 s late, port freed after 10 s), launched together
once per module so that their waits overlap: they sleep, they do not compete for the CPU."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from init_launch import Launcher, free_port

LATE = 40.0
PORT_FREED_AFTER = 10.0


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    launcher = Launcher(tmp_path_factory.mktemp("slow"))
    slow = {"deadline": 90, "attempt_timeout": 10}
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(4)
    busy_port = int(busy.getsockname()[1])
    freed = threading.Timer(PORT_FREED_AFTER, busy.close)  # the held port IS the scenario
    try:
        late_port, master_port = free_port(), free_port()
        handles = {
            "late_worker": [
                launcher.start(0, 2, late_port, kwargs=slow, name="lw-rank0"),
                launcher.start(1, 2, late_port, kwargs=slow, start_after=LATE, name="lw-rank1"),
            ],
            "late_master": [
                launcher.start(0, 2, master_port, kwargs=slow, start_after=LATE, name="lm-rank0"),
                launcher.start(1, 2, master_port, kwargs=slow, name="lm-rank1"),
            ],
            "port_freed": [
                launcher.start(0, 2, busy_port, kwargs={"deadline": 60, "attempt_timeout": 5}, name="pf-rank0"),
                launcher.start(1, 2, busy_port, kwargs={"deadline": 60, "attempt_timeout": 5}, name="pf-rank1"),
            ],
        }
        launched = time.time()
        # Free the port 10 s after rank 0 reported it busy (process start-up time varies under load).
        pf_rank0 = handles["port_freed"][0]
        while "port_busy" not in pf_rank0.log.read_text():
            if pf_rank0.proc.poll() is not None or time.time() - launched > 60:
                raise AssertionError(f"rank 0 never saw the port busy:\n{pf_rank0.log.read_text()[-2000:]}")
            time.sleep(0.05)
        busy_seen = time.time()
        freed.start()
        results = {name: [h.result(LATE + 60) for h in hs] for name, hs in handles.items()}
        for group in results.values():
            for res in group:
                res["since_launch"] = res["t_end"] - launched
                res["since_busy"] = res["t_end"] - busy_seen
        yield results
    finally:
        freed.cancel()
        busy.close()
        launcher.stop_all()


@pytest.mark.timeout(150)
def test_late_worker_40s(outcomes: dict[str, Any]) -> None:
    res0, res1 = outcomes["late_worker"]
    assert res0["ok"] and res1["ok"], (res0, res1)
    assert LATE < res0["since_launch"] < LATE + 15  # formed soon after the late rank came
    attempts = res0["report"]["attempts"]
    assert len(attempts) >= 3 and all(a["missing_ranks"] == [1] for a in attempts[:-1])
    assert res1["elapsed"] < 5


@pytest.mark.timeout(150)
def test_master_starting_last_by_40s(outcomes: dict[str, Any]) -> None:
    res0, res1 = outcomes["late_master"]
    assert res0["ok"] and res1["ok"], (res0, res1)
    assert LATE < res1["since_launch"] < LATE + 15
    assert {a["error"] for a in res1["report"]["attempts"][:-1]} == {"refused"}


@pytest.mark.timeout(150)
def test_port_busy_then_freed_after_10s(outcomes: dict[str, Any]) -> None:
    res0, res1 = outcomes["port_freed"]
    assert res0["ok"] and res1["ok"], (res0, res1)
    assert PORT_FREED_AFTER < res0["since_busy"] < PORT_FREED_AFTER + 8
    assert "port_busy" in {a["error"] for a in res0["report"]["attempts"]}
