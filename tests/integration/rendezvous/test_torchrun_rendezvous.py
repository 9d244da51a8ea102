"""``torchrun --rdzv-backend=distinit`` for real: agents as separate processes on one machine (loopback).

Each scenario asserts the message on every agent names the cause, and bounds the time to it. The times are
generous (a loaded 2-core CI machine starts torchrun in seconds); the benchmark measures them properly.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from rdzv_agents import TORCHRUN, Agents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from launch_support import require

pytestmark = [pytest.mark.launcher("torchrun"), pytest.mark.timeout(150)]


@pytest.fixture(autouse=True)
def _torchrun() -> None:
    require(("torchrun",))
    assert TORCHRUN.exists()


def _ok(text: str, world: int, restart: str = "0") -> None:
    assert f"world={world} sum={world} restart={restart}" in text, text[-3000:]


@pytest.mark.parametrize("count", [3], ids=["3-agents"])  # 2 agents: test_torchrun_hosts.py, on two fake hosts
def test_happy_path_forms_one_world(agents: Agents, port: int, count: int) -> None:
    started = [agents.start(f"a{i}", f"127.0.0.1:{port}", nnodes=str(count)) for i in range(count)]
    for agent in started:
        rc, text, elapsed = agent.wait(120)
        assert rc == 0, text[-3000:]
        _ok(text, count)
        assert "Traceback" not in text, text[-3000:]  # torch may warn that a late shutdown found no store
        assert elapsed < 100


def test_max_restarts_re_rendezvous_and_names_the_round(agents: Agents, port: int) -> None:
    # Every worker fails once (distinit.setup() ran in each). One failing worker with a healthy peer, and a
    # failure past --max-restarts: test_torchrun_restart.py.
    env = {"DISTINIT_TEST_FAIL_ONCE": "all"}
    started = [agents.start(f"a{i}", f"127.0.0.1:{port}", extra=["--max-restarts=1"], env=env) for i in range(2)]
    for agent in started:
        rc, text, _ = agent.wait(120)
        assert rc == 0, text[-3000:]
        _ok(text, 2, restart="1")
        assert "rendezvous 'job': round 0 ended: the worker group failed: rank " in text, text[-3000:]
        assert "restart 1 of --max-restarts=1 (TORCHELASTIC_RESTART_COUNT=1)" in text, text[-3000:]


def test_agent_never_started_is_named_at_join_timeout(agents: Agents, port: int) -> None:
    agent = agents.start("alone", f"127.0.0.1:{port}", conf="join_timeout=4")
    rc, text, elapsed = agent.wait(90)
    assert rc != 0
    assert "AgentRendezvousTimeoutError" in text, text[-3000:]
    assert "1 of --nnodes=2 agents came" in text, text[-3000:]
    assert "never started torchrun" in text and "join_timeout" in text
    assert elapsed < 60


def test_agent_started_late_within_join_timeout_joins(agents: Agents, port: int) -> None:
    first = agents.start("early", f"127.0.0.1:{port}", conf="join_timeout=60")
    _wait_for_listener(port, first, 60)
    second = agents.start("late", f"127.0.0.1:{port}", conf="join_timeout=60")
    for agent in (first, second):
        rc, text, _ = agent.wait(120)
        assert rc == 0, text[-3000:]
        _ok(text, 2)


def test_agent_killed_after_joining_is_named(agents: Agents, port: int, tmp_path: Path) -> None:
    hold = tmp_path / "never"
    conf = "join_timeout=8"
    env = {"DISTINIT_TEST_HOLD": str(hold)}
    survivor = agents.start("survivor", f"127.0.0.1:{port}", conf=conf, extra=["--max-restarts=1"], env=env)
    _wait_for_listener(port, survivor, 60)  # the survivor hosts the store: the store dies with its host agent
    victim = agents.start("victim", f"127.0.0.1:{port}", conf=conf, extra=["--max-restarts=1"], env=env)
    assert agents.wait_for_marks(2, 90), (survivor.log.read_text(), victim.log.read_text())
    victim.kill()
    rc, text, _ = survivor.wait(90)
    assert rc != 0
    assert "AgentRendezvousTimeoutError" in text, text[-3000:]
    assert f"pid {victim.proc.pid}" in text and "stopped heart-beating" in text, text[-3000:]
    assert "joined, then stopped" in text


def test_refused_endpoint_is_named_in_seconds(agents: Agents, port: int) -> None:
    # 127.0.0.2 binds here, but is_host=0 says another node hosts the store: nothing listens there.
    agent = agents.start("client", f"127.0.0.2:{port}", conf="is_host=0,connect_timeout=3")
    rc, text, elapsed = agent.wait(90)
    assert rc != 0
    assert "AgentRendezvousConnectionError" in text and "connection refused" in text, text[-3000:]
    assert f"127.0.0.2:{port}" in text
    assert elapsed < 60


def test_unresolvable_endpoint_is_named(agents: Agents, port: int) -> None:
    agent = agents.start("client", f"no-such-node.invalid:{port}")
    rc, text, elapsed = agent.wait(90)
    assert rc != 0
    assert "'no-such-node.invalid' does not resolve" in text, text[-3000:]
    assert elapsed < 60


def test_foreign_listener_is_named(agents: Agents) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "init"))
    from init_launch import HoldingListener

    listener = HoldingListener()
    try:
        agent = agents.start("client", f"127.0.0.1:{listener.port}")
        rc, text, elapsed = agent.wait(90)
    finally:
        listener.close()
    assert rc != 0
    assert "is not a torch store" in text, text[-3000:]
    assert elapsed < 60


@pytest.mark.parametrize(
    ("flag", "first", "second", "named"),
    [
        pytest.param("nnodes", "2", "3", "--nnodes: '2'", id="nnodes"),
        pytest.param("nproc", 1, 2, "--nproc-per-node: '1'", id="nproc-per-node"),
    ],
)
def test_flag_mismatch_is_named_on_every_agent(
    agents: Agents, port: int, flag: str, first: object, second: object, named: str
) -> None:
    started = [
        agents.start(f"a{i}", f"127.0.0.1:{port}", conf="join_timeout=60", **{flag: value})  # type: ignore[arg-type]
        for i, value in enumerate((first, second))
    ]
    for agent in started:
        rc, text, elapsed = agent.wait(90)
        assert rc != 0
        assert "AgentConfigMismatchError" in text, text[-3000:]
        assert named.split(":")[0] in text and named.split(": ")[1] in text, text[-3000:]
        assert elapsed < 60  # far before join_timeout


def test_two_rdzv_ids_on_one_endpoint_are_named(agents: Agents, port: int) -> None:
    started = [
        agents.start(f"a{i}", f"127.0.0.1:{port}", run_id=run_id, conf="join_timeout=60")
        for i, run_id in enumerate(("job-a", "job-b"))
    ]
    for agent in started:
        rc, text, elapsed = agent.wait(90)
        assert rc != 0
        assert "--rdzv-id: 'job-a'" in text and "'job-b'" in text, text[-3000:]
        assert elapsed < 60


def _wait_for_listener(port: int, agent: object, timeout: float) -> None:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the first agent never listened on {port}")
