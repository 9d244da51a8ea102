"""Real accelerate under real launchers on CPU: ``distinit.setup()`` before ``Accelerator()`` (issue 13, item 4).

accelerate reuses a process group that already exists (ranks from torch, local rank from ``LOCAL_RANK``),
so ``setup()`` first gives it the launcher's world. Without it, accelerate reads the world itself and gets
it wrong in two ways measured here: under ``srun`` it finds no rank variable it knows (``SLURM_PROCID`` is
not one) and every task trains alone as process 0 of 1, silently; under ``mpirun`` it finds the ranks but
no ``MASTER_ADDR``, and fails. One pitfall stays with accelerate: on CPU it needs ``cpu=True``, or it
ignores the group ``setup()`` formed.

Each launch runs ``accelerate_worker.py`` through the launcher-test wrapper (``scripts/launchers``), bounded
by ``run_shape``'s timeout, which kills the launcher's process group when it expires.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launchers"))

import launch_support
from launch_support import cluster, shapes

pytestmark = pytest.mark.launcher

WORKER = Path(__file__).with_name("accelerate_worker.py")
RECORD_PREFIX = "ACCELERATE_RECORD "
LAUNCH_TIMEOUT = 90.0

#: ``mpirun -n 2`` on one node, MASTER_PORT passed with ``-x`` and no MASTER_ADDR, as a user would start it.
MPIRUN = shapes.Shape(
    "accelerate-openmpi",
    "openmpi",
    ("openmpi",),
    2,
    shapes.openmpi("-n", "2", explicit_addr=False, fake_nodes=False),
    description="mpirun.openmpi -n 2",
)
TORCHRUN = shapes.Shape("accelerate-torchrun", "torchrun", ("torchrun",), 2, shapes.torchrun_standalone(2))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    """The emulated Slurm cluster of the launcher tests, for this module's srun launches."""
    launch_support.require(["slurm"])
    workdir = tmp_path_factory.mktemp("accelerate-slurm")
    started = launch_support.start_cluster(workdir)
    try:
        yield started
    finally:
        launch_support.stop_cluster(workdir)


def launch(
    shape: shapes.Shape, mode: str, outdir: Path, slurm_cluster: cluster.Cluster | None = None
) -> list[dict[str, Any]]:
    """Run the worker in MODE in every task of SHAPE; its records in launch-rank order, each with its node."""
    launch_support.require(shape.needs)
    ctx = shapes.Context(python=sys.executable, outdir=outdir / shape.name, cluster=slurm_cluster)
    result = shapes.run_shape(shape, ctx, [sys.executable, str(WORKER), mode], timeout=LAUNCH_TIMEOUT)
    records = []
    for task in result.records:
        lines = [line for line in task["stdout"].splitlines() if line.startswith(RECORD_PREFIX)]
        assert lines, f"task rc={task['rc']} printed no record:\n{task['stderr'][-3000:]}"
        record = json.loads(lines[-1][len(RECORD_PREFIX) :])
        record["node"] = shape.node_of(task)
        records.append(record)
    return records


def true_local_ranks(records: list[dict[str, Any]]) -> list[int]:
    """Each rank's index among the ranks on its node, by global rank (what torchrun calls LOCAL_RANK)."""
    by_rank = sorted(records, key=lambda r: r["torch"]["rank"])
    return [sum(1 for other in by_rank[:i] if other["node"] == r["node"]) for i, r in enumerate(by_rank)]


def assert_trained_as_launched(records: list[dict[str, Any]], world_size: int) -> None:
    """accelerate's indices are torch's and the launcher's on every rank, and one synced step ran."""
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    records = sorted(records, key=lambda r: r["torch"]["rank"])
    assert [r["torch"]["rank"] for r in records] == list(range(world_size)), records
    for record, local_rank in zip(records, true_local_ranks(records), strict=True):
        acc, rank = record["accelerate"], record["torch"]["rank"]
        assert record["reused_group"] is True, record
        assert acc["distributed_type"] == "MULTI_CPU", record
        assert acc["process_index"] == rank == record["distinit"]["rank"], record
        assert acc["num_processes"] == record["torch"]["world_size"] == world_size, record
        assert acc["local_process_index"] == record["distinit"]["local_rank"] == local_rank, record
        assert acc["is_main_process"] is (rank == 0), record
        assert record["gathered_indices"] == list(range(world_size)), record
        # Every rank trained on different data: equal weights after the step mean the gradients were averaged.
        assert record["params_by_rank"] == [record["params_by_rank"][0]] * world_size, record
        assert record["params_by_rank"][0] != record["params_before"], record


@pytest.mark.timeout(120)
def test_mpirun_plain_accelerate_finds_no_master_address(tmp_path: Path) -> None:
    records = launch(MPIRUN, "plain", tmp_path)
    assert [r.get("error", "") for r in records] == [
        "ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable MASTER_ADDR expected, but not set"
    ] * 2, records


@pytest.mark.timeout(120)
def test_mpirun_setup_then_accelerator_trains_as_the_launchers_ranks(tmp_path: Path) -> None:
    assert_trained_as_launched(launch(MPIRUN, "setup", tmp_path), world_size=2)


@pytest.mark.timeout(120)
def test_mpirun_two_fake_nodes_by_node_keeps_local_ranks(tmp_path: Path) -> None:
    shape = shapes.SHAPES_BY_NAME["openmpi-2node-bynode"]  # ranks 0, 2 on one node, 1, 3 on the other
    records = launch(shape, "setup", tmp_path)
    assert_trained_as_launched(records, world_size=4)
    assert true_local_ranks(records) == [0, 0, 1, 1]


@pytest.mark.timeout(120)
def test_torchrun_setup_then_accelerator_trains_as_the_launchers_ranks(tmp_path: Path) -> None:
    assert_trained_as_launched(launch(TORCHRUN, "setup", tmp_path), world_size=2)


@pytest.mark.timeout(150)
def test_srun_plain_accelerate_trains_every_task_alone(tmp_path: Path, slurm: cluster.Cluster) -> None:
    records = launch(shapes.SHAPES_BY_NAME["slurm-1node"], "plain", tmp_path, slurm)
    views = [(r["accelerate"]["distributed_type"], r["accelerate"]["num_processes"]) for r in records]
    assert views == [("NO", 1)] * 2, records
    assert [r["accelerate"]["process_index"] for r in records] == [0, 0], records


@pytest.mark.timeout(150)
def test_srun_cyclic_setup_then_accelerator_trains_as_the_launchers_ranks(
    tmp_path: Path, slurm: cluster.Cluster
) -> None:
    records = launch(shapes.SHAPES_BY_NAME["slurm-cyclic"], "setup", tmp_path, slurm)
    assert_trained_as_launched(records, world_size=4)
    assert true_local_ranks(records) == [0, 0, 1, 1]


@pytest.mark.timeout(120)
def test_setup_then_accelerator_without_cpu_flag_ignores_the_group_on_cpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU accelerate takes the group as MULTI_GPU; the pitfall is CPU-only")
    records = launch(MPIRUN, "setup-default", tmp_path)
    assert [r["torch"]["world_size"] for r in records] == [2, 2], records
    views = [(r["accelerate"]["distributed_type"], r["accelerate"]["process_index"]) for r in records]
    assert views == [("NO", 0)] * 2, records
