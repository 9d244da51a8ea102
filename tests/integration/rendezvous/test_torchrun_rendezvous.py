"""``torchrun --rdzv-backend=distinit`` for real: agents as separate processes on one machine (loopback).

Each scenario asserts the message on every agent names the cause, and bounds the time to it. The times are
generous (a loaded 2-core CI machine starts torchrun in seconds); the benchmark measures them properly.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from collections.abc import Callable
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
    # The victim imports first and joins on go: the survivor's join clock (8 s) starts once it is up, and a
    # victim that only then imported torch missed it on a loaded machine (both timed out, "1 of 2 came").
    victim = agents.start("victim", f"127.0.0.1:{port}", conf=conf, extra=["--max-restarts=1"], env=env, primed=True)
    victim.wait_ready(120)
    survivor = agents.start("survivor", f"127.0.0.1:{port}", conf=conf, extra=["--max-restarts=1"], env=env)
    _wait_for_listener(port, survivor, 60)  # the survivor hosts the store: the store dies with its host agent
    victim.go()
    assert agents.wait_for_marks(2, 90), (survivor.log.read_text(), victim.log.read_text())
    victim.kill()
    rc, text, _ = survivor.wait(90)
    assert rc != 0
    assert "AgentRendezvousTimeoutError" in text, text[-3000:]
    assert f"pid {victim.proc.pid}" in text and "stopped heart-beating" in text, text[-3000:]
    assert "joined, then stopped" in text


def test_store_host_killed_is_named_as_gone_not_as_never_started(agents: Agents, port: int, tmp_path: Path) -> None:
    # The agent hosting the store leaves after both joined: the survivor's store stops answering, whether it
    # learns it while its workers run (torch's num_nodes_waiting) or while it re-joins after they failed.
    hold = tmp_path / "never"
    conf = "join_timeout=30"
    env = {"DISTINIT_TEST_HOLD": str(hold)}
    host = agents.start("host", f"127.0.0.1:{port}", conf=conf, extra=["--max-restarts=1"], env=env)
    _wait_for_listener(port, host, 60)
    survivor = agents.start("survivor", f"127.0.0.1:{port}", conf=conf, extra=["--max-restarts=1"], env=env)
    assert agents.wait_for_marks(2, 90), (host.log.read_text(), survivor.log.read_text())
    host.kill()
    rc, text, _ = survivor.wait(90)
    assert rc != 0
    assert "AgentRendezvousConnectionError" in text and "stopped answering" in text, text[-3000:]
    assert f"the agent hosting it, {socket.gethostname()} pid {host.proc.pid}" in text, text[-3000:]
    assert "never started" not in text and "never seen" not in text, text[-3000:]


def test_store_host_killed_while_the_other_waits_is_named(agents: Agents, port: int) -> None:
    # --nnodes=3 with two agents: both wait in torch's round; the one hosting the store is killed.
    import base64
    import pickle
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    host = agents.start("host", f"127.0.0.1:{port}", nnodes="3", conf="join_timeout=60")
    _wait_for_listener(port, host, 60)
    survivor = agents.start("survivor", f"127.0.0.1:{port}", nnodes="3", conf="join_timeout=60")
    watcher = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    key = "torch.rendezvous.job"

    def both_in_torch_s_round() -> bool:
        raw = watcher.get(key) if watcher.check([key]) else b""
        if raw in (b"", C10dRendezvousBackend._NULL_SENTINEL.encode()):
            return False
        state = pickle.loads(base64.b64decode(raw))  # torch's own state: this test trusts it
        return {node.pid for node in state.participants} >= {host.proc.pid, survivor.proc.pid}

    _wait_for(both_in_torch_s_round, 90, "both agents in torch's round")
    # The survivor reads the cards every 0.25 s while it waits: let its heart-beat (every 1 s) pass twice.
    count = int(watcher.add("distinit.torchrun/count", 0))
    cards = [json.loads(watcher.get(f"distinit.torchrun/card/{i}")) for i in range(1, count + 1)]
    index = 1 + next(i for i, card in enumerate(cards) if card["pid"] == survivor.proc.pid)
    for _ in range(2):
        beat = watcher.get(f"distinit.torchrun/beat/{index}")
        _wait_for(lambda: watcher.get(f"distinit.torchrun/beat/{index}") != beat, 30, "the survivor's beat")  # noqa: B023
    host.kill()
    rc, text, _ = survivor.wait(120)
    assert rc != 0
    assert "AgentRendezvousConnectionError" in text and "stopped answering" in text, text[-3000:]
    assert "while this agent" in text and "waited for round" in text, text[-3000:]
    assert f"the agent hosting it, {socket.gethostname()} pid {host.proc.pid}" in text, text[-3000:]
    assert "never started" not in text and "never seen" not in text, text[-3000:]


def test_forged_cards_on_the_store_never_fail_the_round(agents: Agents, port: int) -> None:
    # Any client of the store can write a card: one of this job with another torch and a beat of 1e18 (it would
    # never go stale), one of another --rdzv-id heart-beating. Neither agent is in torch's round: reported, ignored.
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    prefix = "distinit.torchrun"
    first = agents.start("a0", f"127.0.0.1:{port}", conf="join_timeout=60")
    _wait_for_listener(port, first, 60)
    hostile = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    _wait_for(lambda: int(hostile.add(f"{prefix}/count", 0)) >= 1, 60, "the first agent's card")
    base = {"node": "forger", "hostname": "forger", "python": "3.11.0", "distinit": "0.0.0", "started": 1.0}
    base |= {"min_nodes": 2, "max_nodes": 2, "status": "waiting"}
    forged = {**base, "run_id": "job", "pid": 4242, "torch": "9.9.9"}
    other = {**base, "run_id": "other-job", "pid": 4343, "torch": "2.13.0"}
    stop = threading.Event()
    indexes = [int(hostile.add(f"{prefix}/count", 1)) for _ in range(2)]
    hostile.set(f"{prefix}/card/{indexes[0]}", json.dumps(forged))
    hostile.set(f"{prefix}/beat/{indexes[0]}", "1e18")
    hostile.set(f"{prefix}/card/{indexes[1]}", json.dumps(other))

    def beat() -> None:  # the other --rdzv-id's card stays live while the job runs
        while not stop.is_set():
            try:
                hostile.set(f"{prefix}/beat/{indexes[1]}", str(time.time()))
            except (RuntimeError, ValueError):
                return  # the store left with its host agent
            stop.wait(0.3)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        second = agents.start("a1", f"127.0.0.1:{port}", conf="join_timeout=60")
        results = [agent.wait(120) for agent in (first, second)]
    finally:
        stop.set()
        beater.join(timeout=5)
    for rc, text, _ in results:
        assert rc == 0, text[-3000:]
        _ok(text, 2)
        assert "AgentConfigMismatchError" not in text, text[-3000:]
    logs = "".join(text for _, text, _ in results)
    assert "a foreign card on the store: forger pid 4242" in logs and "torch 9.9.9" in logs, logs[-3000:]


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
    # Reported, not fatal: the other job's agents are not in this job's torch round, and a card any store client
    # can write never fails a round (issue 33). Each job then times out short of its --nnodes.
    started = [
        agents.start(f"a{i}", f"127.0.0.1:{port}", run_id=run_id, conf="join_timeout=15")
        for i, run_id in enumerate(("job-a", "job-b"))
    ]
    for agent in started:
        rc, text, elapsed = agent.wait(90)
        assert rc != 0
        assert "--rdzv-id: 'job-a'" in text and "'job-b'" in text, text[-3000:]
        assert "AgentConfigMismatchError" not in text, text[-3000:]
        # The job that ends first takes the store with it if its agent hosted it: the other's is then lost.
        assert "AgentRendezvousTimeoutError" in text or "stopped answering" in text, text[-3000:]
        assert elapsed < 75


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _wait_for_listener(port: int, agent: object, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the first agent never listened on {port}")


@pytest.mark.parametrize("skew", ["-30s", "+30s"], ids=["behind", "ahead"])
def test_an_agent_whose_clock_is_30_s_off_never_runs_a_wrong_world(agents: Agents, port: int, skew: str) -> None:
    """Issue 33: an agent under ``faketime`` 30 s off, asking for another --nproc-per-node.

    Card heart-beats carry the writer's wall clock, and so do torch's keep-alive beats: by the agent whose
    clock is ahead, torch counts the other dead and formed round 0 with that agent alone, whose worker then
    ran a world of 1 (seen before the fix). Now every agent fails at once, naming the mismatch or the round
    below ``--nnodes`` (with the clock offset when measured), and no worker starts.
    """
    if shutil.which("faketime") is None:
        pytest.skip("needs faketime (apt: faketime)")
    # A constant offset on the wall clock, and on the monotonic one: libfaketime 0.9.10 under Python 3.11 hangs
    # every Event.wait(timeout) then (the skewed agent's card heart-beat thread beats once), but with
    # DONT_FAKE_MONOTONIC=1 its time.sleep raises EINVAL inside torch's join (tried): the former still tests
    # the skewed wall clock on the card and on torch's keep-alive, which is what this test is about.
    skewed = ["faketime", "-f", skew]
    started = [
        agents.start("a0", f"127.0.0.1:{port}", conf="join_timeout=60", nproc=1),
        agents.start("a1", f"127.0.0.1:{port}", conf="join_timeout=60", nproc=2, prefix=skewed),
    ]
    texts = []
    for agent in started:
        rc, text, elapsed = agent.wait(90)
        texts.append(text)
        assert rc != 0
        assert "AgentConfigMismatchError" in text or "AgentRoundTooSmallError" in text, text[-3000:]
        assert "worker rank=" not in text, text[-3000:]  # no worker ran in a world of the wrong size
        assert elapsed < 60  # far before join_timeout
    assert any("--nproc-per-node: '1'" in text for text in texts), texts


def test_an_agent_stopped_for_20_s_while_its_round_runs_resumes_and_the_job_ends_well(
    agents: Agents, port: int, tmp_path: Path
) -> None:
    """Issue 33: agent a1 is SIGSTOPped for 20 s while the round's workers run (they go on all-reducing).

    Its heart-beats (torch's keep-alive and distinit's card) stop for far longer than either counts an agent
    dead, but no rendezvous happens meanwhile: when it resumes, the job ends normally on both agents, with
    nothing named lost and no foreign card.
    """
    import os
    import signal

    hold = tmp_path / "release"
    env = {"DISTINIT_TEST_HOLD": str(hold)}
    started = [agents.start(f"a{i}", f"127.0.0.1:{port}", conf="join_timeout=60", env=env) for i in range(2)]
    assert agents.wait_for_marks(2, 90), [agent.log.read_text()[-2000:] for agent in started]
    os.kill(started[1].proc.pid, signal.SIGSTOP)
    try:
        time.sleep(20)  # the fault itself: how long the agent does not run
    finally:
        os.kill(started[1].proc.pid, signal.SIGCONT)
    hold.touch()
    for agent in started:
        rc, text, _ = agent.wait(90)
        assert rc == 0, text[-3000:]
        _ok(text, 2)
        assert "foreign card" not in text and "stopped answering" not in text, text[-3000:]


class _Marker:
    """A pickle that, when loaded, makes a directory: the harmless stand-in for code a store client runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, int, bool]]:
        import os

        return os.makedirs, (str(self.path), 0o755, True)


def test_torch_s_pickled_state_key_runs_a_store_client_s_code_in_the_agent_a_documented_limit(
    agents: Agents, port: int, tmp_path: Path
) -> None:
    """Issue 33, item 5: torch's round state (``torch.rendezvous.<run_id>``) is a pickle every agent loads.

    A store client writes a pickle there; the agent loads it and the pickle's code runs in the agent, under
    ``--rdzv-backend=distinit`` as under c10d (distinit does not replace torch's state handling). This test pins
    the limit docs/torchrun.md states; it fails, and the docs must change, once torch stops unpickling it.
    """
    import base64
    import pickle
    from datetime import timedelta

    from torch.distributed import TCPStore

    marker = tmp_path / "ran-in-the-agent"
    agent = agents.start("a0", f"127.0.0.1:{port}", conf="join_timeout=30")
    _wait_for_listener(port, agent, 60)
    hostile = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    _wait_for(lambda: hostile.check(["torch.rendezvous.job"]), 60, "torch's state key")
    hostile.set("torch.rendezvous.job", base64.b64encode(pickle.dumps(_Marker(marker))).decode())
    _wait_for(marker.exists, 60, "the agent to load the pickle")
