"""A deterministic failure ends setup() at once; torch 2.4's libuv store server falls back to the legacy one.

Real processes, a real TCPStore and gloo on loopback; torch's TCPStore is patched inside each rank to fail as an
older torch does (issue 35).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from init_launch import free_port
from tests._zygote import popen

WORKER = Path(__file__).with_name("_unsupported_worker.py")


class Ranks:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, mode: str, rank: int, world: int, port: int) -> Path:
        out = self.tmp / f"rank{rank}.json"
        log = (self.tmp / f"rank{rank}.log").open("wb")
        cmd = [sys.executable, str(WORKER), mode, str(rank), str(world), str(port), str(out)]
        self.procs.append(popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        return out

    def result(self, out: Path, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while not out.exists():
            if time.monotonic() > end:
                logs = "\n".join(p.read_text()[-1500:] for p in sorted(self.tmp.glob("*.log")))
                raise AssertionError(f"no result in {out.name} within {timeout} s:\n{logs}")
            time.sleep(0.05)
        result: dict[str, Any] = json.loads(out.read_text())
        return result

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Ranks]:
    handle = Ranks(tmp_path)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.mark.timeout(90)
def test_a_deterministic_hosting_failure_ends_setup_at_once(ranks: Ranks) -> None:
    port = free_port()
    out0 = ranks.start("unsupported", 0, 2, port)
    ranks.start("unsupported", 1, 2, port)  # waits for a store that never comes: only rank 0 can know
    res = ranks.result(out0, 60)
    assert res["ok"] is False and res["error"] == "RendezvousError", res
    # at once: not at the 120 s deadline, not even after one 20 s attempt
    assert res["elapsed"] < 15, res["elapsed"]
    assert len(res["calls"]) == 1, res["calls"]  # tried once, never retried
    first = res["message"].splitlines()[0]
    assert f"rank 0 cannot host the store on port {port}" in first, first
    assert "TypeError: __init__(): incompatible constructor arguments" in first and "Not retried" in first
    assert "fix:" in res["message"]


@pytest.mark.timeout(90)
def test_a_store_server_that_refuses_our_listener_falls_back_to_the_legacy_server(ranks: Ranks) -> None:
    port = free_port()
    outs = [ranks.start("libuv", rank, 2, port) for rank in range(2)]
    results = [ranks.result(out, 60) for out in outs]
    assert all(r["ok"] for r in results), results
    assert {r["sum"] for r in results} == {3.0}
    host = results[0]
    # first the default server with our listener, refused; then the legacy one with it, and that one stays
    assert host["calls"][0].get("use_libuv", True) is not False
    assert host["calls"][-1]["use_libuv"] is False and host["calls"][-1]["master_listen_fd"] is not None
    said = [line for line in host["records"] if "legacy server" in line]
    assert len(said) == 1, host["records"]
    assert host["elapsed"] < 30
