"""Faults made for real in namespaces of our own (root only): bad interfaces, a tiny or dirty /dev/shm, and
two fake hosts that both claim node rank 0. Each must be named by its check, with exit status 1."""

from __future__ import annotations

import os
import shutil

import pytest
from doctor_launch import Ranks, Switch, check, in_uts, rank_environ
from init_launch import NetNs, netns_available

_REASON = netns_available() or (None if shutil.which("unshare") else "needs unshare (util-linux)")
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("nosuch0", "no interface 'nosuch0' on this host"),
        ("^lo", "'^' is NCCL syntax"),
        ("down0", "interface 'down0' is down"),
    ],
)
def test_route_names_a_bad_gloo_interface(
    ranks: Ranks, port: int, value: str, said: str, request: pytest.FixtureRequest
) -> None:
    netns = NetNs(f"distinit-doc-{os.getpid()}-{port}")
    request.addfinalizer(netns.close)
    netns.ip("link", "add", "down0", "type", "veth", "peer", "name", "down1")  # exists, left down
    # route is a local check: --skip world spares the world's doomed rendezvous (~14 s of its deadline); the
    # world failing because of the route is test_doctor_world.py's test_a_bad_interface_at_world_four_...
    ranks.start(
        rank_environ(0, 1, port, GLOO_SOCKET_IFNAME=value),
        args=["--json", "--timeout", "20", "--skip", "world"],
        prefix=netns.prefix,
    )
    ((status, report),) = ranks.results(40)
    found = check(report, "route")
    assert found["status"] == "fail" and said in found["summary"], found
    assert f"GLOO_SOCKET_IFNAME={value!r}" in found["summary"]
    assert "export GLOO_SOCKET_IFNAME=lo" in found["fix"]
    assert status == 1


def _in_private_shm(size: str, then: str = "") -> list[str]:
    """A prefix: a private mount namespace with a ``size`` tmpfs on /dev/shm, ``then`` run before the command."""
    script = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && {then or "true"} && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


@pytest.mark.timeout(60)
def test_a_one_mib_dev_shm_fails(ranks: Ranks, port: int) -> None:
    ranks.start(rank_environ(0, 1, port), args=["--json", "--skip", "world"], prefix=_in_private_shm("1M"))
    ((status, report),) = ranks.results(40)
    found = check(report, "shm")
    assert found["status"] == "fail" and "/dev/shm: 1 MiB" in found["summary"] and "NCCL needs" in found["summary"]
    assert status == 1


@pytest.mark.timeout(60)
def test_a_segment_left_by_a_killed_process_is_listed(ranks: Ranks, port: int) -> None:
    # The kill waits for the file, not for a clock: under load the child's interpreter took longer than the
    # 0.5 s this once slept, was killed before it opened the file, and left nothing (status "pass").
    leave = (
        'python3 -c \'import time; f=open("/dev/shm/nccl-left-behind","wb"); time.sleep(60)\' & '
        "child=$! && for _ in $(seq 600); do [ -e /dev/shm/nccl-left-behind ] && break; sleep 0.05; done; "
        "kill -9 $child && wait $child; true"
    )
    ranks.start(rank_environ(0, 1, port), args=["--json", "--skip", "world"], prefix=_in_private_shm("1G", leave))
    ((status, report),) = ranks.results(40)
    found = check(report, "shm")
    assert found["status"] == "warn" and "nccl-left-behind" in found["summary"]
    assert found["evidence"]["stale"] == ["nccl-left-behind"]
    assert status == 0  # a warning does not fail the doctor


@pytest.mark.timeout(120)
def test_two_fake_hosts_claiming_node_zero_are_named_by_nodes(
    ranks: Ranks, port: int, request: pytest.FixtureRequest
) -> None:
    tag = f"{os.getpid()}-{port}"
    a, b = NetNs(f"distinit-na-{tag}"), NetNs(f"distinit-nb-{tag}")
    request.addfinalizer(a.close)
    request.addfinalizer(b.close)
    if_a, if_b = a.link(b)
    same = {"NODE_RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for rank, ns, ifname, name in ((0, a, if_a, "fake-a"), (1, b, if_b, "fake-b")):
        environ = rank_environ(rank, 2, port, addr="10.254.0.1", GLOO_SOCKET_IFNAME=ifname, **same)
        ranks.start(environ, prefix=[*ns.prefix, *in_uts(name)])
    (status, world), _ = ranks.results(90)
    found = check(world, "nodes")
    assert found["status"] == "fail" and found["hosts"] == ["fake-a", "fake-b"], found
    assert "2 hosts claim node rank 0: fake-a, fake-b" in found["summary"]
    assert check(world, "reach")["status"] == "pass"  # the fake hosts do reach each other
    assert status == 1


@pytest.mark.timeout(150)
def test_reach_names_the_one_blocked_host_pair(ranks: Ranks, port: int, request: pytest.FixtureRequest) -> None:
    """Three fake hosts on one bridge; host 1 drops its 1-byte-payload TCP segments to host 2 (what the reach
    probe sends, on connections host 1 opens; gloo's own traffic passes, so the world forms). Only ``h1 -> h2``
    may be named: host 2's probe of host 1 gets its 1-byte answer (a reply-direction packet)."""
    switch = Switch(f"{os.getpid() % 10**5}", 3)
    request.addfinalizer(switch.close)
    # IPv4 20 + TCP 20 (+12 with timestamps) + 1 byte of payload
    switch.nft(
        1,
        "add table inet distinit",
        "add chain inet distinit out { type filter hook output priority 0; }",
        f"add rule inet distinit out ip daddr {switch.addresses[2]} ct direction original ip length {{ 41, 53 }} drop",
    )
    for rank in range(3):
        environ = rank_environ(
            rank,
            3,
            port,
            addr=switch.addresses[0],
            GLOO_SOCKET_IFNAME="eth0",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            NODE_RANK=str(rank),
        )
        ranks.start(
            environ,
            args=["--json", "--timeout", "40", "--bandwidth"],
            prefix=[*switch.prefix(rank), *in_uts(f"h{rank}")],
        )
    (status, world), *_ = ranks.results(100)
    found = check(world, "reach")
    assert found["status"] == "fail", found
    assert found["evidence"]["failures"] == [["h1", "h2", "timeout"]]
    assert found["hosts"] == ["h1", "h2"] and "h1 -> h2: timeout" in found["summary"]
    assert found["evidence"]["pairs_tested"] == 6
    assert check(world, "nodes")["status"] == "pass"
    rates = check(world, "bandwidth")["evidence"]["gb_per_s"]
    assert sorted(rates) == ["h0 -> h1", "h1 -> h2", "h2 -> h0"]
    assert all(isinstance(rate, float) and rate > 0 for rate in rates.values()), rates
    assert status == 1
