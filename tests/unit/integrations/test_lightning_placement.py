"""DistinitEnvironment on every rank of real launcher captures: round-robin trains, what cannot train is one error.

Each capture (``tests/integration/launchers/captures``) holds the variables a real launcher gave every task.
A real Lightning ``Trainer`` is built from each task's variables, as that task would build it: Lightning's
global, local and node rank must be the launcher's, and the ``DistributedSampler`` arguments Lightning would
use must give disjoint shards that cover the data. Settings that cannot train must raise one error, word for
word, on every task (decided from facts every task holds), and never suggest a flag the launch already uses.
Also the argument checks of issue 23 item 11.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distinit import env_from_scheduler
from distinit.errors import ConflictingEnvError, DistinitError, IncompleteEnvError, MalformedEnvError

pytest.importorskip("lightning")

from lightning.pytorch import Trainer
from torch.utils.data import DistributedSampler

from distinit.integrations.lightning import DistinitEnvironment

CAPTURES = Path(__file__).resolve().parents[2] / "integration" / "launchers" / "captures"
QUIET: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
#: The launcher's own rank and local rank variables, per family (ground truth the test reads directly).
RANK_VARS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")
LOCAL_VARS = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK")
pytestmark = pytest.mark.usefixtures("clean_environ")


def tasks(name: str) -> list[dict[str, str]]:
    """Every task's variables of capture NAME, with a MASTER_ADDR as the shapes pass it."""
    return [{"MASTER_ADDR": "h0", **task} for task in json.loads((CAPTURES / f"{name}.json").read_text())]


def first(task: dict[str, str], names: tuple[str, ...]) -> int:
    return int(next(task[name] for name in names if name in task))


def build_and_validate(task: dict[str, str], devices: int, num_nodes: int) -> None:
    """Build the Trainer as the task would, then run what fit() calls first (validate_settings)."""
    env = DistinitEnvironment(task)
    built = Trainer(accelerator="cpu", devices=devices, num_nodes=num_nodes, plugins=[env], **QUIET)
    env.validate_settings(built.strategy.num_processes, built.strategy.num_nodes)


def error_on_every_task(name: str, devices: int, num_nodes: int) -> list[DistinitError]:
    """The error each task of NAME raises building the Trainer and starting fit (validate_settings)."""
    errors = []
    for task in tasks(name):
        with pytest.raises(DistinitError) as caught:
            build_and_validate(task, devices, num_nodes)
        errors.append(caught.value)
    return errors


@pytest.mark.parametrize(
    "name",
    ["slurm-block", "slurm-cyclic", "slurm-pmi2", "openmpi-2node", "openmpi-2node-bynode", "torchrun-static-2node"],
)
def test_every_task_trains_as_the_launcher_placed_it(name: str) -> None:
    shards = []
    for task in tasks(name):
        world = env_from_scheduler(task)
        assert world.local_world_size is not None and world.num_nodes is not None
        devices, nodes = world.local_world_size, world.num_nodes
        env = DistinitEnvironment(task)
        built = Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp", plugins=[env], **QUIET)
        env.validate_settings(built.strategy.num_processes, built.strategy.num_nodes)
        assert built.global_rank == first(task, RANK_VARS)
        assert built.local_rank == first(task, LOCAL_VARS)
        assert built.node_rank == world.node_rank
        kwargs = built.strategy.distributed_sampler_kwargs
        shards.append(list(DistributedSampler(range(48), shuffle=False, **kwargs)))
    seen = [index for shard in shards for index in shard]
    assert sorted(seen) == list(range(48)), shards  # disjoint and covering


@pytest.mark.parametrize(
    ("name", "devices", "num_nodes", "words", "flags"),
    [
        pytest.param(
            "slurm-block", 3, 2, "asks for 2 node(s) of 3", "srun -N2 --ntasks-per-node=3", id="slurm-devices"
        ),
        pytest.param("slurm-cyclic", 2, 3, "asks for 3 node(s) of 2", "srun -N3 --ntasks-per-node=2", id="slurm-nodes"),
        pytest.param("slurm-uneven", 2, 2, "started 2,1 processes on its 2 nodes", "--ntasks-per-node", id="srun-n3"),
        pytest.param("slurm-3node", 1, 3, "started 2,1,1 processes on its 3 nodes", "-N3", id="srun-N3-n4"),
        pytest.param("openmpi-2node-bynode", 1, 2, "asks for 2 node(s) of 1", "--map-by ppr:1:node", id="ompi-dev"),
        pytest.param("openmpi-2node-uneven", 2, 2, "started 3,1 processes", "--map-by ppr:2:node", id="ompi-uneven"),
        pytest.param("mpich-2node", 2, 2, "unknown off rank 0's node", "NODE_RANK", id="hydra-no-node"),
    ],
)
def test_what_cannot_train_is_one_error_on_every_task(
    name: str, devices: int, num_nodes: int, words: str, flags: str
) -> None:
    errors = error_on_every_task(name, devices, num_nodes)
    messages = {str(error) for error in errors}
    assert len(messages) == 1, messages  # the same verdict, word for word, on every task
    error = errors[0]
    assert isinstance(error, (ConflictingEnvError, IncompleteEnvError))
    assert words in error.what and flags in error.fix, error
    assert "--distribution" not in str(error)  # never a fix the launch already applied, nor a block demand


def test_uneven_srun_names_ntasks_per_node() -> None:
    # srun -N2 -n4 placed 3+1 (Slurm's choice for -n without --ntasks-per-node); every task knows both counts.
    uneven = [
        task | {"SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_TASKS_PER_NODE": "3,1"} for task in tasks("slurm-block")
    ]
    layout = [(0, 0), (1, 1), (2, 2), (3, 0)]
    for task, (procid, local) in zip(uneven, layout, strict=True):
        task.update(
            SLURM_PROCID=str(procid),
            SLURM_LOCALID=str(local),
            SLURM_NODEID="0" if procid < 3 else "1",
            SLURM_GTIDS="0,1,2" if procid < 3 else "3",
            SLURMD_NODENAME="dnode1" if procid < 3 else "dnode2",
            SLURM_TOPOLOGY_ADDR="dnode1" if procid < 3 else "dnode2",
        )
        task.pop("SLURM_NTASKS_PER_NODE")
    messages = set()
    for task in uneven:
        with pytest.raises(ConflictingEnvError) as caught:
            DistinitEnvironment(task).validate_settings(2, 2)
        messages.add(str(caught.value))
        assert "srun -N2 --ntasks-per-node=2" in caught.value.fix and "not -n alone" in caught.value.fix
    assert len(messages) == 1, messages


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        pytest.param({"environ": ["RANK=0"]}, "environ must be a mapping of str to str", id="environ-list"),
        pytest.param({"environ": 3}, "environ must be a mapping of str to str", id="environ-int"),
        pytest.param({"env": {"rank": 0, "world_size": 1}}, "env must be a distinit.DistEnv", id="env-dict"),
        pytest.param({"environ": {b"RANK": b"0", b"WORLD_SIZE": b"1"}}, "os.environb", id="environb"),
        pytest.param({"environ": {"RANK": 0}}, "environ must map str to str", id="int-value"),
    ],
)
def test_wrong_argument_types_are_type_errors(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(TypeError, match=named):
        DistinitEnvironment(**kwargs)


def test_os_environb_is_refused_not_read_as_a_world_of_one() -> None:
    environb = {b"OMPI_COMM_WORLD_RANK": b"1", b"OMPI_COMM_WORLD_SIZE": b"2"}
    with pytest.raises(TypeError, match=r"pass os\.environ"):
        DistinitEnvironment(environb)  # type: ignore[arg-type]


@pytest.mark.parametrize(("devices", "nodes"), [("2", "2"), (2.0, 1), (True, 1), (2, None)])
def test_validate_settings_wants_ints(devices: Any, nodes: Any) -> None:
    env = DistinitEnvironment(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    )
    with pytest.raises(TypeError, match="must be an int"):
        env.validate_settings(devices, nodes)


@pytest.mark.parametrize("port", ["0", "65536", "99999999999"])
def test_master_port_out_of_range_names_the_tcp_range(port: str) -> None:
    with pytest.raises(MalformedEnvError) as caught:
        DistinitEnvironment({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": port})
    assert "(1-65535)" in str(caught.value) and "2147483647" not in str(caught.value)


def test_fabric_launch_refuses_before_any_group_forms() -> None:
    from lightning.fabric import Fabric

    task = tasks("slurm-cyclic")[1]
    env = DistinitEnvironment(task)
    fabric = Fabric(accelerator="cpu", devices=3, num_nodes=2, strategy="ddp", plugins=[env])
    assert (fabric.global_rank, fabric.local_rank, fabric.node_rank) == (1, 0, 1)  # the launcher's, round robin
    with pytest.raises(ConflictingEnvError, match="srun -N2 --ntasks-per-node=3"):
        fabric.launch()  # validate_settings runs first; a group would need the other tasks
