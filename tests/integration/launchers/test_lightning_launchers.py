"""Real Lightning ``Trainer.fit`` under the REAL launchers on emulated nodes, in both forms of docs/integrations.md.

Each launch runs ``lightning_world.py forms`` in every task: the plugin-only form
(``plugins=[DistinitEnvironment()]``, Lightning forms the group), then the ``setup()`` form
(``DistinitEnvironment(env=distinit.setup().env)``). In each form, ``devices`` one too many and
``num_nodes`` one too many must be refused with the same message on every rank and no rank entering DDP
init; then the real fit must train as the launcher placed the ranks: Lightning's global, local and node
rank equal to the launcher's (the node from ground truth distinit does not read), and the
``DistributedSampler`` shards disjoint and covering the data. Round-robin placements (``mpirun --map-by
node``, ``srun --distribution=cyclic``) train like block ones, as with Lightning's own launcher environments.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import shapes
from launch_support import Launcher

pytest.importorskip("lightning")
pytestmark = pytest.mark.launcher

WORKER = Path(__file__).with_name("lightning_world.py")
ITEMS = 32  # lightning_world.ITEMS
#: Two emulated nodes of two tasks: block and round-robin, under Open MPI and Slurm.
PLACEMENTS = ["openmpi-2node", "openmpi-2node-bynode", "slurm-block", "slurm-cyclic"]
RANK_VARS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_VARS = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def steps(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The task's JSON lines by step name."""
    found = {}
    for line in record.get("stdout", "").splitlines():
        if line.startswith("{"):
            parsed = json.loads(line)
            found[parsed["step"]] = parsed
    return found


def launcher_value(record: dict[str, Any], names: tuple[str, ...]) -> int:
    return int(next(record["env"][name] for name in names if name in record["env"]))


def check_refused(by_task: list[dict[str, dict[str, Any]]], step: str, error: str, words: str) -> str:
    """Every task refused STEP with the same ERROR message, and none entered DDP init."""
    lines = [task.get(step, {}) for task in by_task]
    assert [line.get("error") for line in lines] == [error] * len(lines), lines
    assert len({line["message"] for line in lines}) == 1, lines  # one verdict, word for word
    assert not any(line["ddp_init"] for line in lines), lines
    assert words in lines[0]["message"], lines[0]
    message: str = lines[0]["message"]
    return message


def check_trained(shape: shapes.Shape, records: list[dict[str, Any]], by_task: list[dict[str, Any]], step: str) -> None:
    """Every task trained STEP as the launcher placed it, and the shards cover the data once."""
    seen: list[int] = []
    on_node: dict[int, set[int]] = {}
    for record, task in zip(records, by_task, strict=True):
        line = task.get(step, {})
        detail = f"{step}: {line}\nstdout: {record.get('stdout')}\nstderr: {record.get('stderr', '')[-3000:]}"
        assert line.get("ok"), detail
        assert line["lightning_global_rank"] == line["torch_rank"] == launcher_value(record, RANK_VARS), detail
        assert line["lightning_local_rank"] == launcher_value(record, LOCAL_VARS), detail
        assert line["lightning_world_size"] == line["torch_world_size"] == shape.world_size
        assert line["steps"] == ITEMS // shape.world_size // 4
        on_node.setdefault(shape.node_of(record), set()).add(line["lightning_node_rank"])
        seen += line["indices"]
    assert sorted(seen) == list(range(ITEMS)), seen  # disjoint and covering
    # Each real node got one node rank, distinct nodes distinct ones, numbered by their lowest rank.
    assert all(len(ranks) == 1 for ranks in on_node.values()), on_node
    assert sorted(next(iter(ranks)) for ranks in on_node.values()) == list(range(len(shape.nodes))), on_node


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", PLACEMENTS)
def test_both_forms_train_every_placement_and_refuse_what_cannot(name: str, launch: Launcher) -> None:
    shape = shapes.SHAPES_BY_NAME[name]
    result = launch(shape, [sys.executable, str(WORKER), "forms"], timeout=240)
    by_task = [steps(record) for record in result.records]
    for form in ("plugin", "setup"):
        devices = check_refused(by_task, f"{form}-devices-wrong", "ConflictingEnvError", "devices=3, num_nodes=2")
        nodes = check_refused(by_task, f"{form}-nodes-wrong", "ConflictingEnvError", "devices=2, num_nodes=3")
        flag = "--ntasks-per-node=" if shape.launcher == "slurm" else "--map-by ppr:"
        assert flag in devices and flag in nodes and "--distribution" not in devices + nodes
        check_trained(shape, result.records, by_task, f"{form}-fit")


@pytest.mark.timeout(300)
def test_uneven_nodes_are_refused_the_same_on_every_rank_in_both_forms(launch: Launcher) -> None:
    # srun -N2 -n3 places 2+1: Lightning's sampler would split the data into devices * num_nodes = 4 shards
    # for 3 ranks (its own SLURMEnvironment refuses `-n` without `--ntasks-per-node`). Every step of both
    # forms stops with the one uneven-nodes verdict, whatever devices/num_nodes each rank passed.
    shape = shapes.SHAPES_BY_NAME["slurm-uneven"]
    result = launch(shape, [sys.executable, str(WORKER), "forms"], timeout=240)
    by_task = [steps(record) for record in result.records]
    words = "started 2,1 processes on its 2 nodes"
    messages = {
        check_refused(by_task, f"{form}-{step}", "ConflictingEnvError", words)
        for form in ("plugin", "setup")
        for step in ("devices-wrong", "nodes-wrong", "fit")
    }
    assert len(messages) == 1, messages  # Slurm's own list is quoted in both forms
    assert "srun -N2 --ntasks-per-node=" in messages.pop()


@pytest.mark.timeout(300)
def test_hydra_plugin_form_refuses_on_every_rank_and_setup_form_trains(launch: Launcher) -> None:
    # MPICH hydra exports no node index or count: alone, only the ranks on rank 0's node know theirs. Every
    # rank refuses in the Trainer constructor (none waits in DDP init for the others); setup() finds the nodes.
    shape = shapes.SHAPES_BY_NAME["mpich-2node"]
    result = launch(shape, [sys.executable, str(WORKER), "forms"], timeout=240)
    by_task = [steps(record) for record in result.records]
    check_refused(by_task, "plugin-refused", "IncompleteEnvError", "unknown off rank 0's node")
    check_refused(by_task, "setup-devices-wrong", "ConflictingEnvError", "devices=3, num_nodes=2")
    check_refused(by_task, "setup-nodes-wrong", "ConflictingEnvError", "devices=2, num_nodes=3")
    check_trained(shape, result.records, by_task, "setup-fit")


@pytest.mark.timeout(240)
def test_a_wrong_node_rank_fails_the_same_on_every_rank(launch: Launcher) -> None:
    # Open MPI's fake nodes (by slot): NODE_RANK=0 exported on both, as a job script's `export NODE_RANK=0`.
    shape = shapes.SHAPES_BY_NAME["openmpi-2node"]
    result = launch(shape, [sys.executable, str(WORKER), "wrong-node-rank"], timeout=180, allow_failure=True)
    by_task = [steps(record) for record in result.records]
    assert len(by_task) == shape.world_size, result.launcher_output
    message = check_refused(by_task, "setup-refused", "ConflictingEnvError", "2 hosts claim node rank 0")
    assert message


@pytest.mark.timeout(300)
def test_a_rank_killed_before_fit_is_named_by_every_survivor_in_the_settings_exchange(launch: Launcher) -> None:
    """srun cyclic without -K1, setup() + DistinitEnvironment: rank 1 SIGKILLed after setup(); the plugin's
    settings exchange fails on every other rank with RankLostError naming rank 1, never a live rank."""
    cyclic = shapes.SHAPES_BY_NAME["slurm-cyclic"]
    opts = ("-K0", "-N2", "-n4", "--ntasks-per-node=2", "--distribution=cyclic", "-w", "dnode[1-2]")
    shape = dataclasses.replace(cyclic, name="slurm-cyclic-k0", build=shapes.srun(*opts))
    result = launch(shape, [sys.executable, str(WORKER), "killed", "1"], timeout=240, allow_failure=True)
    by_task = [steps(record) for record in result.records]
    pids = {task["killed-ready"]["rank"]: task["killed-ready"]["pid"] for task in by_task if "killed-ready" in task}
    assert sorted(pids) == [0, 1, 2, 3], result.launcher_output[-3000:]
    survivors = [task for task in by_task if task["killed-ready"]["rank"] != 1]
    for task in survivors:
        line = task.get("killed-fit", {})
        assert line.get("error") == "RankLostError", task
        assert "rank 1 (host " in line["message"] and f"pid {pids[1]})" in line["message"], line["message"]
        assert not line["ddp_init"], line
        for alive in (0, 2, 3):
            assert f": rank {alive} (host " not in line["message"], line["message"]
