"""``distinit doctor`` under the REAL launchers: srun on the emulated cluster, mpirun, hydra, torchrun.

Every task of a launch shape (``scripts/launchers/shapes.py``) runs ``distinit doctor --json``. The
doctor must pass: the emulated nodes share this machine's kernel, so notes and warnings about that are
allowed, failures are not. Rank 0's JSON holds the world; its ``nodes`` check must group the ranks
exactly as the launcher placed them (ground truth the doctor does not read: the node each task record
names, see ``task.py``), and every other rank's document must agree on the verdict.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
import shapes
from launch_support import Launcher, distinit_bin

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
