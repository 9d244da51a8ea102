"""``distinit doctor`` under the REAL launchers: srun on the emulated cluster, mpirun, hydra, torchrun.

Every task of a launch shape (``scripts/launchers/shapes.py``) runs ``distinit doctor --json``. The
doctor must pass: the emulated nodes share this machine's kernel, so notes and warnings about that are
allowed, failures are not. Rank 0's JSON holds the world; its ``nodes`` check must group the ranks
exactly as the launcher placed them (ground truth the doctor does not read: the node each task record
names, see ``task.py``), and every other rank's document must agree on the verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import shapes
from launch_support import Launcher, distinit_bin, unavailable

pytestmark = pytest.mark.launcher

#: A handful of representative shapes: srun block/cyclic/3 nodes, Open MPI fake nodes by slot and by
#: node, hydra fake hosts, torchrun standalone and torchrun agents inside srun.
SHAPES = [
    "slurm-block",
    "slurm-cyclic",
    "slurm-3node",
    "openmpi-2node",
    "openmpi-2node-bynode",
    "mpich-2node",
    "torchrun-in-srun",
]


def doctor_command() -> list[str]:
    return [distinit_bin(), "doctor", "--json", "--timeout", "60"]


def document(record: dict[str, Any]) -> dict[str, Any]:
    """The one JSON document a task's ``distinit doctor --json`` printed."""
    lines = [line for line in record.get("stdout", "").splitlines() if line.startswith("{")]
    detail = (
        f"task exited {record.get('rc')}\nstdout: {record.get('stdout')}\nstderr: {record.get('stderr', '')[-3000:]}"
    )
    assert len(lines) == 1, detail
    found: dict[str, Any] = json.loads(lines[0])
    assert record.get("rc") == (0 if found["ok"] else 1), detail
    return found


def failures(report: dict[str, Any]) -> str:
    return "\n".join(f"{c['status']} {c['id']}: {c['summary']}" for c in report["checks"] if c["status"] != "pass")


def check(report: dict[str, Any], check_id: str) -> dict[str, Any]:
    (found,) = [c for c in report["checks"] if c["id"] == check_id]
    return found


def assert_doctor_passes(shape: shapes.Shape, result: shapes.Result) -> dict[str, Any]:
    """Every rank passes; rank 0's ``nodes`` check matches where each task really ran. Returns rank 0's."""
    reports = [document(r) for r in result.records]
    shown = "\n".join(failures(r) for r in reports)
    assert sorted(r["rank"] for r in reports) == list(range(shape.world_size)), f"{shape.name}:\n{shown}"
    world = next(r for r in reports if r["rank"] == 0)
    assert world["ok"], f"{shape.name}:\n{failures(world)}"
    assert world["world_size"] == shape.world_size
    assert all(r["ok"] and r["world_size"] == shape.world_size for r in reports), reports
    assert [c["id"] for c in world["checks"] if c["status"] == "fail"] == [], failures(world)
    assert check(world, "world")["status"] == "pass"

    true_nodes: dict[int, list[int]] = defaultdict(list)
    for record, report in zip(result.records, reports, strict=True):
        true_nodes[shape.node_of(record)].append(report["rank"])
    nodes = check(world, "nodes")
    assert nodes["status"] == "pass", nodes
    found = sorted(sorted(h["ranks"]) for h in nodes["evidence"]["hosts"])
    assert found == sorted(sorted(ranks) for ranks in true_nodes.values()), f"{shape.name}: {nodes}"
    if len(true_nodes) > 1:  # emulated nodes share this kernel: a note, never a conflict
        assert nodes["evidence"]["conflicts"] == [], nodes
        assert any("share one kernel" in n for n in nodes["evidence"]["notes"]), nodes
        assert check(world, "reach")["status"] == "pass", check(world, "reach")
    return world


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", SHAPES)
def test_doctor_passes_under_the_launcher(name: str, launch: Launcher) -> None:
    shape = shapes.SHAPES_BY_NAME[name]
    result = launch(shape, doctor_command(), timeout=150, allow_failure=True)
    assert_doctor_passes(shape, result)


@pytest.mark.timeout(200)
def test_doctor_passes_under_torchrun_four_processes(launch: Launcher) -> None:
    shape = shapes.Shape(
        "torchrun-4",
        "torchrun",
        ("torchrun",),
        4,
        shapes.torchrun_standalone(4),
        description="torchrun --standalone --nproc-per-node=4",
    )
    world = assert_doctor_passes(shape, launch(shape, doctor_command(), timeout=150, allow_failure=True))
    assert check(world, "reach")["status"] == "skip"  # one host: no pair to test


#: The rsh agent of the two-host job: runs orted in HOST's network namespace under HOST's name, with that
#: host's own GLOO_SOCKET_IFNAME (the ranks inherit orted's environment).
AGENT = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1
shift
case "$host" in
    host-a) ns={ns_a}; ifname={if_a} ;;
    host-b) ns={ns_b}; ifname={if_b} ;;
    *) echo "unknown host $host" >&2; exit 1 ;;
esac
DISTINIT_FAKE_HOST=$host
GLOO_SOCKET_IFNAME=$ifname
export DISTINIT_FAKE_HOST GLOO_SOCKET_IFNAME
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' sh "$host" "$*"
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair (10.254.9.1 on host-a, .2 on host-b), each with an
    ``/etc/hosts`` mapping its own name to 127.0.1.1 (Debian's installer does this): the hostname resolves
    to loopback, so only GLOO_SOCKET_IFNAME makes gloo advertise a routable address."""
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("unshare")):
        unavailable("two hosts in network namespaces need root, ip (iproute2) and unshare (util-linux)")
    tag = f"{os.getpid() % 100000}"
    names = (f"distinit-dla-{tag}", f"distinit-dlb-{tag}")
    try:
        for name, host in zip(names, ("host-a", "host-b"), strict=True):
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            Path("/etc/netns", name).mkdir(parents=True, exist_ok=True)
            Path("/etc/netns", name, "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host}\n")
        _ip("link", "add", "dlveth0", "netns", names[0], "type", "veth", "peer", "name", "dlveth1", "netns", names[1])
        for name, ifname, address in zip(names, ("dlveth0", "dlveth1"), ("10.254.9.1", "10.254.9.2"), strict=True):
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", ifname)
            _ip("-n", name, "link", "set", ifname, "up")
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], check=False, timeout=10, capture_output=True)
            shutil.rmtree(Path("/etc/netns", name), ignore_errors=True)


@pytest.mark.timeout(200)
def test_doctor_passes_a_healthy_two_host_mpirun_job_with_gloo_socket_ifname_per_host(
    launch: Launcher, two_hosts: tuple[str, str], tmp_path: Path
) -> None:
    """Issue 22: under mpirun on two hosts (separate network namespaces, hostnames resolving to loopback)
    with GLOO_SOCKET_IFNAME set per host, a job that trains: the doctor must pass, exit 0, on every rank.
    ``setup()`` skips the loopback rule when the interface is named; so does ``names``. Open MPI's node-rank
    note is not a warning, and an interface name set per host is no disagreement."""
    agent = tmp_path / "agent"
    agent.write_text(AGENT.format(ns_a=two_hosts[0], ns_b=two_hosts[1], if_a="dlveth0", if_b="dlveth1"))
    agent.chmod(0o755)

    def build(shape: shapes.Shape, ctx: shapes.Context, cmd: list[str]) -> list[shapes.Launch]:
        argv = [
            *("ip", "netns", "exec", two_hosts[0]),  # mpirun itself runs on host-a
            *shapes.OPENMPI_BASE,
            *("--mca", "plm_rsh_agent", str(agent), "--host", "host-a:2,host-b:2", "-n", "4"),
            *("-x", "MASTER_ADDR=10.254.9.1", "-x", f"MASTER_PORT={ctx.port()}"),
        ]
        return [shapes.Launch([*argv, *ctx.task(cmd)], ctx.env())]

    shape = shapes.Shape(
        "openmpi-2host-netns",
        "openmpi",
        ("openmpi",),
        4,
        build,
        ("host-a", "host-b"),
        "fake_host",
        "exact_or_none",
        description="mpirun.openmpi --host host-a:2,host-b:2 -n 4, hosts in two network namespaces",
    )
    result = launch(shape, doctor_command(), timeout=150, allow_failure=True)
    reports = [document(record) for record in result.records]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert all(record.get("rc") == 0 for record in result.records), [failures(r) for r in reports]
    world = next(r for r in reports if r["rank"] == 0)
    assert world["ok"] and not [c for c in world["checks"] if c["status"] == "fail"], failures(world)
    for check_id in ("env", "names", "route", "consensus", "nodes", "reach"):
        assert check(world, check_id)["status"] == "pass", check(world, check_id)
    assert check(world, "consensus")["evidence"]["per_host"] == {
        "GLOO_SOCKET_IFNAME": {"host-a": "dlveth0", "host-b": "dlveth1"}
    }
    hosts = sorted(sorted(h["ranks"]) for h in check(world, "nodes")["evidence"]["hosts"])
    true_nodes: dict[int, list[int]] = defaultdict(list)
    for record, report in zip(result.records, reports, strict=True):
        true_nodes[shape.node_of(record)].append(report["rank"])
    assert hosts == sorted(sorted(ranks) for ranks in true_nodes.values())
