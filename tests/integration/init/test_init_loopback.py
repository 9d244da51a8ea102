"""gloo advertising a loopback address (the Debian ``127.0.1.1 <hostname>`` trap) on two fake hosts.

Each fake host is a network namespace of its own (joined to the other by a veth pair, 10.254.0.1 and
10.254.0.2), a UTS namespace with its own hostname, and a private ``/etc/hosts`` (``ip netns exec`` binds
``/etc/netns/<name>/hosts`` over it) mapping that hostname to 127.0.1.1, as Debian's installer does.
Root only; namespaces and files are removed afterwards.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from init_launch import Launcher, NetNs, netns_available

_REASON = netns_available()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
BYPASS = str(Path(__file__).with_name("_loopback_worker.py"))
#: One process per fake host: the environment says two nodes of one rank each.
ONE_PER_HOST = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


@dataclass
class Host:
    ns: NetNs
    hostname: str
    ifname: str

    def prefix(self, *, bypass: bool = False) -> list[str]:
        """Run in this host's namespace under its own hostname (optionally with the pre-flight off)."""
        uts = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname]
        return [*self.ns.prefix, *uts, *([sys.executable, BYPASS] if bypass else [])]


def _trapped(ns: NetNs, hostname: str) -> None:
    (ns.resolv_dir / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n")


@pytest.fixture
def hosts(port: int) -> Iterator[tuple[Host, Host]]:
    tag = f"{os.getpid()}-{port}"
    a = NetNs(f"distinit-lpa-{tag}")
    b: NetNs | None = None
    try:
        b = NetNs(f"distinit-lpb-{tag}")
        if_a, if_b = a.link(b)
        pair = (Host(a, "host-a", if_a), Host(b, "host-b", if_b))
        for host in pair:
            _trapped(host.ns, host.hostname)
        yield pair
    finally:
        for ns in (a, b):
            if ns is not None:
                (ns.resolv_dir / "hosts").unlink(missing_ok=True)
                ns.close()


def _start(launcher: Launcher, hosts: tuple[Host, Host], port: int, **options: Any) -> list[dict[str, Any]]:
    env, bypass = options.pop("env", {}), options.pop("bypass", False)
    kwargs = options.pop("kwargs", {"deadline": 120, "attempt_timeout": 10})
    handles = [
        launcher.start(
            rank,
            2,
            port,
            addr="10.254.0.1",
            kwargs=kwargs,
            prefix=host.prefix(bypass=bypass),
            env={**ONE_PER_HOST, **env},
        )
        for rank, host in enumerate(hosts)
    ]
    return [h.result(90) for h in handles]


def _retries(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in res["events"] if e.get("event") == "init.attempt_failed"]


@pytest.mark.timeout(240)
def test_preflight_names_the_trap_and_its_fix_works(launcher: Launcher, hosts: tuple[Host, Host], port: int) -> None:
    """(a) Before any network traffic, on both hosts: the hostname, what it resolves to, the interface to name.
    Then the fix as the message words it (this host's interface) forms the world."""
    results = _start(launcher, hosts, port)
    for res, host in zip(results, hosts, strict=True):
        assert res["error"] == "RendezvousError", res
        message = res["message"]
        assert f"hostname {host.hostname!r} resolves to 127.0.1.1" in message, message
        assert "gloo would advertise the loopback address 127.0.1.1" in message
        assert "GLOO_SOCKET_IFNAME is unset" in message
        assert f"export GLOO_SOCKET_IFNAME={host.ifname}`" in message  # the interface that reaches MASTER_ADDR
        assert "127.0.1.1 <hostname>" in message  # the why: Debian's /etc/hosts line
        assert res["elapsed"] < 5, res  # pre-flight: no attempt was made
        assert not _retries(res)
    fixed = [re.search(r"export GLOO_SOCKET_IFNAME=(\S+)`", r["message"]) for r in results]
    env = [{"GLOO_SOCKET_IFNAME": m.group(1)} for m in fixed if m is not None]
    handles = [
        launcher.start(
            rank, 2, port, addr="10.254.0.1", kwargs={"deadline": 60}, prefix=h.prefix(), env={**ONE_PER_HOST, **e}
        )
        for rank, (h, e) in enumerate(zip(hosts, env, strict=True))
    ]
    for res in (h.result(90) for h in handles):
        assert res["ok"], res


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("env", "bypass", "remote"),
    [
        pytest.param({}, True, "127.0.1.1", id="hostname-trap-preflight-off"),
        pytest.param({"GLOO_SOCKET_IFNAME": "lo"}, False, "127.0.0.1", id="GLOO_SOCKET_IFNAME-lo"),
    ],
)
def test_connect_full_mesh_to_loopback_is_one_verdict_on_every_rank(
    launcher: Launcher, hosts: tuple[Host, Host], port: int, env: dict[str, str], bypass: bool, remote: str
) -> None:
    """(b) gloo meets the trap itself: the rank that connects to a loopback peer gets `connectFullMesh ...
    remote=[127.x]` and publishes the verdict; the rank blocked waiting for that connection (gloo would hold
    it about five attempt timeouts) raises the same verdict within seconds. No retry, no new generation."""
    results = _start(launcher, hosts, port, env=env, bypass=bypass)
    messages = {res["message"] for res in results}
    assert len(messages) == 1, messages  # one verdict, worded once, on every rank
    (message,) = messages
    for res in results:
        assert res["error"] == "RendezvousError", res
        assert not _retries(res), _retries(res)  # never a second attempt, so never another generation
        assert res["elapsed"] < 25, res  # init's bound is 10 s; gloo alone would block ~50 s, the deadline 120 s
    assert "connectFullMesh" in message and f"a peer at {remote}:" in message, message
    assert "generation 0" in message
    assert "export GLOO_SOCKET_IFNAME=dveth" in message  # the same fix as the pre-flight's
    assert "only 1 of the 2 ranks run on this host, per LOCAL_WORLD_SIZE" in message  # why it spans hosts


@pytest.mark.timeout(120)
def test_one_host_with_the_trap_is_no_alarm(launcher: Launcher, hosts: tuple[Host, Host], port: int) -> None:
    """(c) The whole world on the trapped host, MASTER_ADDR its routable address: loopback works, no alarm."""
    host = hosts[0]
    handles = [
        launcher.start(rank, 2, port, addr="10.254.0.1", kwargs={"deadline": 60}, prefix=host.prefix())
        for rank in (0, 1)
    ]
    for res in (h.result(90) for h in handles):
        assert res["ok"], res
        assert not _retries(res)
