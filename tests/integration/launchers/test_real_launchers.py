"""``distinit env`` under the REAL launchers: srun, sbatch, salloc, mpirun, hydra, torchrun.

Every task of every launch shape (``scripts/launchers/shapes.py``) runs
``distinit env --json --check``: it resolves its world, exports it, forms a real gloo group with
``init_method=env://`` and verifies it (all_reduce of ranks, all_gather of identities). The test
then checks each task's answer against ground truth the resolver does not read: the launcher's
own rank variable, the node the task really ran on (``SLURMD_NODENAME``, the fake rsh agent's host,
hydra's interface host name, the torchrun agent), and the layout that was asked for.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
import shapes
from launch_support import Launcher, distinit_bin

pytestmark = pytest.mark.launcher

LAUNCHED = [pytest.param(s, id=s.name) for s in shapes.SHAPES if s.expect_rc == 0 and s.worlds == 1]
NOT_LAUNCHED = [s for s in shapes.SHAPES if s.expect_rc != 0]
#: The variable holding each launcher's own rank for a task.
RANK_VARIABLE = {"slurm": "SLURM_PROCID", "openmpi": "OMPI_COMM_WORLD_RANK", "mpich": "PMI_RANK", "torchrun": "RANK"}
#: Ports of a derived MASTER_PORT (a hash of job and step id), outside Linux's ephemeral range.
DERIVED_PORTS = range(20000, 32768)
DISTENV_FIELDS = {
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
    "launcher",
    "job_id",
    "restart_count",
    "sources",
    "notes",
}


def check_command() -> list[str]:
    return [distinit_bin(), "env", "--json", "--check", "--check-timeout", "60"]


def answer(record: dict[str, Any]) -> dict[str, Any]:
    """The JSON line a task's ``distinit env --json`` printed."""
    lines = [line for line in record.get("stdout", "").splitlines() if line.startswith("{")]
    detail = (
        f"task pid {record['pid']} exited {record.get('rc')}\nstdout: {record.get('stdout')}\n"
        f"stderr: {record.get('stderr', '')[-3000:]}\nenv: {record['env']}"
    )
    assert record.get("rc") == 0, detail
    assert len(lines) == 1, detail
    document: dict[str, Any] = json.loads(lines[0])
    return document


def expected_master_addr(shape: shapes.Shape, records: list[dict[str, Any]]) -> str:
    """Explicit MASTER_ADDR, else rank 0's Slurm node, else loopback (whole world on one node)."""
    first = records[0]
    if "MASTER_ADDR" in first["env"]:
        return str(first["env"]["MASTER_ADDR"])
    if "slurm" in shape.needs:
        return str(first["truth"]["slurmd_nodename"])
    return "127.0.0.1"


def assert_world(shape: shapes.Shape, result: shapes.Result) -> list[dict[str, Any]]:
    """Every task's resolved world matches the launch's ground truth; returns the answers."""
    records = result.records
    answers = [answer(r) for r in records]
    size = shape.world_size
    context = "\n".join(json.dumps({k: a.get(k) for k in sorted(DISTENV_FIELDS)}) for a in answers)

    assert sorted(a["rank"] for a in answers) == list(range(size)), context
    nodes: dict[int, list[int]] = defaultdict(list)
    for record, ans in zip(records, answers, strict=True):
        assert set(ans) >= DISTENV_FIELDS, f"missing fields {DISTENV_FIELDS - set(ans)}"
        assert ans["launcher"] == shape.launcher, context
        assert ans["rank"] == int(record["env"][RANK_VARIABLE[shape.launcher]]), context
        assert ans["world_size"] == size, context
        nodes[shape.node_of(record)].append(ans["rank"])
    num_nodes = len(nodes)
    assert sorted(nodes) == list(range(len(shape.nodes) or 1)), f"tasks did not land on every node asked for: {nodes}"

    master_addr = expected_master_addr(shape, records)
    for record, ans in zip(records, answers, strict=True):
        node = shape.node_of(record)
        on_node = sorted(nodes[node])
        where = f"rank {ans['rank']} ({shape.name}, true node {node})\n{context}"
        assert ans["local_rank"] == on_node.index(ans["rank"]), where
        assert ans["local_world_size"] in (len(on_node), None), where
        if shape.node_rank == "exact":
            assert ans["node_rank"] == node, where
            assert ans["num_nodes"] == num_nodes, where
            assert ans["local_world_size"] == len(on_node), where
        else:
            assert ans["node_rank"] in (node, None), where
            if ans["node_rank"] is not None and "NODE_RANK" not in record["env"]:
                # A node rank the launcher did not export is an assumption, and must say so.
                assert any("node_rank" in note for note in ans["notes"]), where
            assert ans["num_nodes"] in (num_nodes, None), where
        assert ans["master_addr"] == master_addr, where
        explicit_port = record["env"].get("MASTER_PORT")
        if explicit_port is not None:
            assert ans["master_port"] == int(explicit_port), where
        else:
            assert ans["master_port"] in DERIVED_PORTS, where
        if shape.launcher == "slurm":
            assert ans["job_id"] == record["env"]["SLURM_JOB_ID"], where
        if shape.launcher == "torchrun":
            assert ans["restart_count"] == 0, where

        check = ans["check"]
        assert check["ok"], f"{where}\ncheck: {check}"
        assert check["all_reduce_sum"] == check["expected_sum"] == size * (size - 1) // 2, where
        peers = {p[0]: p for p in check["peers"]}
        assert sorted(peers) == list(range(size)), where
        for other in answers:
            assert peers[other["rank"]][1:3] == [other["local_rank"], other["node_rank"]], where

    ports = {a["master_port"] for a in answers}
    assert len(ports) == 1, f"ranks disagree on MASTER_PORT: {ports}"
    return answers


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shape", LAUNCHED)
def test_every_task_resolves_its_world(shape: shapes.Shape, launch: Launcher) -> None:
    result = launch(shape, check_command())
    assert_world(shape, result)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("shape", NOT_LAUNCHED, ids=[s.name for s in NOT_LAUNCHED])
def test_allocation_without_srun_is_refused(shape: shapes.Shape, launch: Launcher) -> None:
    """The sbatch batch script and the salloc shell look like a job but are one process."""
    result = launch(shape, [distinit_bin(), "env", "--json"])
    (record,) = result.records
    assert record["rc"] == 2, record
    assert "NotLaunchedError" in record["stderr"], record["stderr"]
    assert "srun" in record["stderr"], record["stderr"]
    assert record["stdout"] == "", record["stdout"]


@pytest.mark.timeout(150)
def test_batch_step_no_strict_is_a_single_process(launch: Launcher) -> None:
    """``--no-strict`` turns the batch step into a one-process world with a note, and --check passes."""
    result = launch(shapes.SHAPES_BY_NAME["slurm-batch-step"], [*check_command(), "--no-strict"])
    (ans,) = [answer(r) for r in result.records]
    assert (ans["rank"], ans["world_size"], ans["local_rank"]) == (0, 1, 0)
    assert ans["notes"], ans
    assert ans["check"]["ok"], ans


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["slurm-cyclic", "openmpi-2node-bynode", "mpich-in-slurm", "torchrun-in-srun"])
def test_explain_prints_the_world(name: str, launch: Launcher) -> None:
    """``distinit env --explain`` under a real launcher names the rank, world, launcher and sources."""
    shape = shapes.SHAPES_BY_NAME[name]
    result = launch(shape, [distinit_bin(), "env", "--explain"])
    for record in result.records:
        assert record["rc"] == 0, record
        text = record["stdout"]
        rank = int(record["env"][RANK_VARIABLE[shape.launcher]])
        assert f"rank {rank} of {shape.world_size}, launcher {shape.launcher}" in text, text
        assert RANK_VARIABLE[shape.launcher] in text, text
        assert "exports:" in text, text
        assert f"RANK={rank} " in text, text
        assert f"WORLD_SIZE={shape.world_size}" in text, text


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["openmpi-2node", "mpich-2node"])
def test_multinode_mpi_without_master_addr_says_how_to_pass_it(name: str, launch: Launcher) -> None:
    """Plain multi-node mpirun/hydra export no MASTER_ADDR: --check must refuse with the fix, not hang."""
    shape = shapes.SHAPES_BY_NAME[name]
    result = launch(shape, check_command(), with_master=False, timeout=90, allow_failure=True)
    for record in result.records:
        assert record["rc"] == 2, record
        assert "MASTER_ADDR" in record["stderr"], record["stderr"]


@pytest.mark.timeout(150)
def test_arbitrary_distribution_leaves_master_addr_unknown(launch: Launcher) -> None:
    """With --distribution=arbitrary rank 0 is not on the first node: MASTER_ADDR must be unknown, not guessed."""
    shape = shapes.SHAPES_BY_NAME["slurm-arbitrary"]
    result = launch(shape, [distinit_bin(), "env", "--json"], with_master=False)
    answers = [answer(r) for r in result.records]
    assert sorted(a["rank"] for a in answers) == [0, 1, 2, 3]
    for record, ans in zip(result.records, answers, strict=True):
        assert ans["rank"] == int(record["env"]["SLURM_PROCID"])
        assert ans["node_rank"] == shape.node_of(record), ans
        assert ans["master_addr"] is None, ans
        assert any("arbitrary" in note for note in ans["notes"]), ans["notes"]


@pytest.mark.timeout(150)
def test_concurrent_steps_of_one_job_get_distinct_ports(launch: Launcher) -> None:
    """Two srun steps running at once in one job form two worlds; their derived MASTER_PORTs differ."""
    shape = shapes.SHAPES_BY_NAME["slurm-concurrent-steps"]
    result = launch(shape, check_command())
    steps: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in result.records:
        steps[record["env"]["SLURM_STEP_ID"]].append(answer(record))
    assert len(steps) == 2, steps
    ports = set()
    for answers in steps.values():
        assert sorted(a["rank"] for a in answers) == [0, 1], answers
        assert {a["world_size"] for a in answers} == {2}, answers
        assert all(a["check"]["ok"] for a in answers), answers
        (port,) = {a["master_port"] for a in answers}
        assert port in DERIVED_PORTS, port
        ports.add(port)
    assert len(ports) == 2, f"concurrent steps share MASTER_PORT {ports}"
