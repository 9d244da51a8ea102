"""A worker failure under ``torchrun --rdzv-backend=distinit --max-restarts=N`` with a real gloo group (issue 31).

Two agents on loopback; rank 1's worker raises, rank 0's stays healthy without a collective, so its agent
restarts on seeing the failed node re-join (torch's uncounted membership change), deterministically. Every
wait is on a process exit; no fixed sleeps.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rdzv_agents import TORCHRUN, Agents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import require

WORKER = Path(__file__).with_name("_restart_worker.py")
JOIN_TIMEOUT = 20

pytestmark = [pytest.mark.launcher("torchrun"), pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def _torchrun() -> None:
    require(("torchrun",))
    assert TORCHRUN.exists()


def _start_two(agents: Agents, port: int, env: dict[str, str]) -> list[tuple[int, str, float]]:
    """Start agents a and b; (exit code, log, seconds from its start to its exit) of each."""
    started = [
        agents.start(
            name,
            f"127.0.0.1:{port}",
            conf=f"join_timeout={JOIN_TIMEOUT}",
            extra=["--max-restarts=1"],
            env=env,
            script=WORKER,
        )
        for name in ("a", "b")
    ]
    exited: dict[str, float] = {}
    deadline = time.monotonic() + 180
    while len(exited) < len(started) and time.monotonic() < deadline:
        for agent in started:
            if agent.name not in exited:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.proc.wait(timeout=0.1)
                    exited[agent.name] = time.monotonic() - agent.started
    results = []
    for agent in started:
        rc, text, elapsed = agent.wait(0.1)  # kills an agent still running at the deadline
        results.append((rc, text, exited.get(agent.name, elapsed)))
    return results


def _lines(text: str, start: str) -> list[str]:
    return [line[line.index(start) :] for line in text.splitlines() if start in line]


def test_failed_worker_restart_forms_the_next_round_on_every_node(agents: Agents, port: int, tmp_path: Path) -> None:
    env = {"DISTINIT_TEST_FAIL": "once", "DISTINIT_TEST_FAIL_RANKS": "1", "DISTINIT_TEST_RELEASE": str(tmp_path / "x")}
    results = _start_two(agents, port, env)
    restart_lines = []
    for rc, text, _ in results:
        assert rc == 0, text[-4000:]
        assert re.search(r"worker rank=\d world=2 sum=2 restart=1", text), text[-4000:]  # both nodes counted it
        found = _lines(text, "rendezvous 'job': round 0 ended")
        assert len(found) == 1, text[-4000:]
        restart_lines.append(found[0])
    assert restart_lines[0] == restart_lines[1]  # one wording on every agent
    line = restart_lines[0]
    assert "rank 1 (local_rank 0, pid " in line and "exited with code 1" in line, line
    assert "RuntimeError: deliberate failure of rank 1 at restart 0" in line, line  # from torch's error file
    assert "restart 1 of --max-restarts=1 (TORCHELASTIC_RESTART_COUNT=1)" in line, line
    assert "uncounted" not in line


def test_failure_past_max_restarts_is_one_verdict_on_every_agent(agents: Agents, port: int, tmp_path: Path) -> None:
    release = str(tmp_path / "x")
    env = {"DISTINIT_TEST_FAIL": "always", "DISTINIT_TEST_FAIL_RANKS": "1", "DISTINIT_TEST_RELEASE": release}
    results = _start_two(agents, port, env)
    verdicts = []
    for rc, text, _ in results:
        assert rc != 0, text[-4000:]  # nobody stays silent: both exit, the healthy one stopped by the verdict
        found = _lines(text, "rendezvous 'job': round 1 failed after restart 1 of --max-restarts=1, none left")
        assert found, text[-4000:]
        verdicts.append(found[0])
    assert verdicts[0] == verdicts[1], verdicts
    exits = sorted(elapsed for _, _, elapsed in results)  # started together: the healthy one follows the verdict
    assert exits[1] - exits[0] < JOIN_TIMEOUT, exits
    assert "RuntimeError: deliberate failure of rank 1 at restart 1" in verdicts[0]
    assert any("AgentRendezvousClosedError" in text for _, text, _ in results)
