"""``torchrun --rdzv-backend=distinit`` across emulated hosts: one network + UTS namespace per agent, a bridge.

Each agent runs in a fake host of its own (``node0``, ``node1``, ...; the doctor's ``Switch`` and ``in_uts``), so
host names, addresses and firewalls are per node as on a cluster. Root only (network namespaces, nftables).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rdzv_agents import Agents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "init"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))
from doctor_launch import Switch, in_uts
from init_launch import netns_available
from launch_support import require

pytestmark = [pytest.mark.launcher("torchrun"), pytest.mark.timeout(150)]


@pytest.fixture
def switch(request: pytest.FixtureRequest) -> Iterator[Switch]:
    require(("torchrun",))
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    handle = Switch(f"r{os.getpid() % 10**4}{abs(hash(request.node.nodeid)) % 100}", 2, subnet="10.254.9")
    try:
        yield handle
    finally:
        handle.close()


def _on(switch: Switch, i: int) -> dict[str, object]:
    """Start arguments for an agent on fake host ``i``: its namespace, its name, its address for the workers."""
    return {
        "prefix": [*switch.prefix(i), *in_uts(f"node{i}")],
        "extra": [f"--local-addr={switch.addresses[i]}"],
        "env": {"GLOO_SOCKET_IFNAME": "eth0"},
    }


def test_two_hosts_form_one_world(agents: Agents, switch: Switch) -> None:
    endpoint = f"{switch.addresses[0]}:29500"
    started = [agents.start(f"node{i}", endpoint, **_on(switch, i)) for i in (0, 1)]  # type: ignore[arg-type]
    for agent in started:
        rc, text, _ = agent.wait(120)
        assert rc == 0, text[-3000:]
        assert "world=2 sum=2 restart=0" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]  # torch may warn that a late shutdown found no store


def test_black_holed_endpoint_is_named_in_seconds(agents: Agents, switch: Switch) -> None:
    switch.nft(
        1,
        "add table inet distinit",
        "add chain inet distinit out { type filter hook output priority 0; }",
        "add rule inet distinit out tcp dport 29500 drop",
    )
    agent = agents.start("node1", f"{switch.addresses[0]}:29500", **_on(switch, 1))  # type: ignore[arg-type]
    rc, text, elapsed = agent.wait(90)
    assert rc != 0
    assert "AgentRendezvousConnectionError" in text and "packets vanish" in text, text[-3000:]
    assert f"{switch.addresses[0]}:29500" in text and "from node1" in text, text[-3000:]
    assert elapsed < 60


def test_agent_killed_after_joining_names_its_host(agents: Agents, switch: Switch, tmp_path: Path) -> None:
    endpoint = f"{switch.addresses[0]}:29500"
    started = []
    for i in (0, 1):  # node0 hosts the store (its address is the endpoint); node1 is the one that dies
        options = _on(switch, i)
        options["extra"] = [*options["extra"], "--max-restarts=1"]  # type: ignore[misc]
        options["env"] = {"DISTINIT_TEST_HOLD": str(tmp_path / "never"), "GLOO_SOCKET_IFNAME": "eth0"}
        started.append(agents.start(f"node{i}", endpoint, conf="join_timeout=8", primed=True, **options))  # type: ignore[arg-type]
    for agent in started:  # both imported, then both join together: the round forms within the 8 s
        agent.wait_ready(120)
    for agent in started:
        agent.go()
    survivor, victim = started
    assert agents.wait_for_marks(2, 90), (survivor.log.read_text(), victim.log.read_text())
    victim.kill()
    rc, text, elapsed = survivor.wait(90)
    assert rc != 0
    assert elapsed < 120
    assert "AgentRendezvousTimeoutError" in text, text[-3000:]
    assert "seen, then stopped heart-beating: node1 pid" in text and "the agent on node1 joined" in text, text[-3000:]


def test_an_alias_endpoint_is_hosted_where_torch_finds_no_match(agents: Agents, switch: Switch) -> None:
    # The endpoint is an alias of node0's address (pytorch#64926) and the hosts do not resolve their own names:
    # c10d's hostname matching then dies with "socket.gaierror: [Errno -3] Temporary failure in name resolution"
    # on both agents (measured, torch 2.13; with a resolvable hostname nobody would host the store). distinit
    # sees that the alias's address binds on node0, hosts the store there and says so.
    made = []
    try:
        for name in switch.names[1:]:
            folder = Path("/etc/netns") / name  # ip-netns-exec bind-mounts this hosts file over /etc/hosts
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(f"127.0.0.1 localhost\n{switch.addresses[0]} rdzv-alias\n")
            made.append(folder)
        started = [agents.start(f"node{i}", "rdzv-alias:29500", **_on(switch, i)) for i in (0, 1)]  # type: ignore[arg-type]
        texts = []
        for agent in started:
            rc, text, _ = agent.wait(120)
            assert rc == 0, text[-3000:]
            assert "world=2 sum=2 restart=0" in text, text[-3000:]
            texts.append(text)
        assert "distinit hosts the store here" in texts[0] and switch.addresses[0] in texts[0], texts[0][-3000:]
        assert "is_host=1" in texts[0]
    finally:
        for folder in made:
            (folder / "hosts").unlink(missing_ok=True)
            folder.rmdir()
