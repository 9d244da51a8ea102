"""DistinitEnvironment against the real Lightning classes (Trainer, Fabric), without launching processes.

Lightning builds its world in the Trainer's constructor: ``DDPStrategy.set_world_ranks`` calls
``set_global_rank(node_rank * devices + local_rank)`` and ``set_world_size(num_nodes * devices)``. So a
Trainer built from one rank's environment shows the rank Lightning would train as.

That the imports stay lazy and never touch ``mpi4py`` is checked in a fresh interpreter, in
``tests/integration/integrations/test_lightning_process.py``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import pytest

from distinit import env_from_scheduler
from distinit.errors import ConflictingEnvError, IncompleteEnvError
from tests.unit.env.cases import hydra, ompi, torchrun

lightning = pytest.importorskip("lightning")

from lightning.fabric import Fabric  # noqa: E402
from lightning.fabric.plugins.environments import ClusterEnvironment  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402

from distinit.integrations.lightning import DistinitEnvironment  # noqa: E402

MASTER = {"MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
QUIET: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
pytestmark = pytest.mark.usefixtures("clean_environ")


def trainer(env: DistinitEnvironment | None, *, devices: int = 2, num_nodes: int = 2) -> Trainer:
    plugins = [] if env is None else [env]
    return Trainer(accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy="ddp", plugins=plugins, **QUIET)


def block(rank: int, **extra: str) -> dict[str, str]:
    """Rank ``rank`` of mpirun -n 4 on two nodes, two each (Open MPI 4.1 with its node count)."""
    return ompi(rank, 4, rank % 2, 2, OMPI_MCA_orte_num_nodes="2", **MASTER, **extra)


def test_implements_every_abstract_member_of_each_installed_lightning() -> None:
    bases = [ClusterEnvironment]
    try:
        from lightning_fabric.plugins.environments import ClusterEnvironment as Standalone
    except ImportError:
        pass
    else:
        bases.append(Standalone)
    env = DistinitEnvironment(block(3))
    for base in bases:
        assert isinstance(env, base)
        missing = {name for name in base.__abstractmethods__ if name not in vars(DistinitEnvironment)}
        assert not missing, f"{base.__module__}.ClusterEnvironment members not implemented: {missing}"
    assert not DistinitEnvironment.__abstractmethods__


@pytest.mark.parametrize("rank", range(4))
def test_trainer_gets_the_launchers_ranks_under_mpirun(rank: int) -> None:
    built = trainer(DistinitEnvironment(block(rank)))
    assert (built.global_rank, built.local_rank, built.node_rank, built.world_size) == (rank, rank % 2, rank // 2, 4)


@pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is not None,
    reason="mpi4py is installed: Lightning's own MPIEnvironment takes the ranks from MPI_Init, which ends this "
    "process outside a real mpirun (seen on a GPU machine: pytest exited 1 here with no report)",
)
def test_without_the_plugin_every_node_is_node_zero() -> None:
    # Lightning #13639, the shape of the bug: under mpirun nobody sets NODE_RANK (or LOCAL_RANK), so rank 3 of
    # node 1 trains as GLOBAL_RANK 0, and Lightning even means to start the node's processes itself.
    os.environ.update(block(3))
    plain = trainer(None)
    assert plain.global_rank == 0
    assert plain.strategy.cluster_environment.creates_processes_externally is False
    # With distinit's world exported (env_from_scheduler(export=True)) Lightning sees NODE_RANK and LOCAL_RANK.
    env_from_scheduler(export=True)
    assert trainer(None).global_rank == 3
    del os.environ["NODE_RANK"], os.environ["GROUP_RANK"]
    assert trainer(None).global_rank == 1, "without NODE_RANK every node is node 0"
    assert trainer(DistinitEnvironment()).global_rank == 3  # reads os.environ


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (torchrun(3, 4, 1, 2, 1, 2), (3, 1, 1)),
        (
            {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", **MASTER},
            (2, 0, 1),
        ),
    ],
    ids=["torchrun", "exported-with-NODE_RANK"],
)
def test_trainer_under_other_launchers(environ: dict[str, str], expected: tuple[int, int, int]) -> None:
    built = trainer(DistinitEnvironment(environ))
    assert (built.global_rank, built.local_rank, built.node_rank) == expected


def test_fabric_and_pytorch_lightning_accept_it() -> None:
    env = DistinitEnvironment(block(3))
    fabric = Fabric(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", plugins=[env])
    assert (fabric.global_rank, fabric.node_rank, fabric.world_size) == (3, 1, 4)
    pl = pytest.importorskip("pytorch_lightning")
    built = pl.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", plugins=[env], **QUIET)
    assert built.global_rank == 3


def test_round_robin_placement_trains_with_the_launchers_ranks(caplog: pytest.LogCaptureFixture) -> None:
    # mpirun --map-by node: rank 1 runs on node 1 as its local rank 0; Lightning would call it rank 2. Like
    # Lightning's own launcher environments, the launcher's rank stands and Lightning's arithmetic is logged.
    env = DistinitEnvironment(block(1, OMPI_MCA_rmaps_base_mapping_policy="node") | {"OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    with caplog.at_level(logging.DEBUG, logger="distinit.integrations"):
        built = trainer(env)
    assert (built.global_rank, built.local_rank, built.node_rank, built.world_size) == (1, 0, 1, 4)
    assert built.strategy.distributed_sampler_kwargs == {"num_replicas": 4, "rank": 1}
    assert "Lightning computed global rank 2" in caplog.text
    env.validate_settings(num_devices=2, num_nodes=2)


def test_one_process_per_node_with_devices_two_is_refused_the_same_on_both_ranks() -> None:
    # mpirun -n 2 on two nodes with Trainer(devices=2): Lightning would wait for ranks nobody starts. Both
    # ranks know both nodes' counts (2 nodes, 1 process here, 2 in all): one message, word for word.
    envs = [DistinitEnvironment(ompi(rank, 2, 0, 1, OMPI_MCA_orte_num_nodes="2", **MASTER)) for rank in (0, 1)]
    messages = set()
    for env in envs:
        with pytest.raises(ConflictingEnvError, match=r"asks for 2 node\(s\) of 2 process") as caught:
            env.validate_settings(num_devices=2, num_nodes=2)
        messages.add(str(caught.value))
        assert "devices=1" in caught.value.fix and "num_nodes" not in caught.value.fix.split(";")[0]
    assert len(messages) == 1, messages


@pytest.mark.parametrize(
    ("devices", "nodes", "message", "fix"),
    [
        (1, 4, "asks for 4 node(s) of 1 process", "set devices=2 and num_nodes=2"),
        (2, 3, "asks for 3 node(s) of 2 process", "set num_nodes=2;"),
        (3, 2, "asks for 2 node(s) of 3 process", "set devices=2;"),
    ],
)
def test_validate_settings(devices: int, nodes: int, message: str, fix: str) -> None:
    env = DistinitEnvironment(block(0))
    env.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(ConflictingEnvError) as caught:
        env.validate_settings(num_devices=devices, num_nodes=nodes)
    assert message in str(caught.value) and fix in caught.value.fix, caught.value
    assert f"--map-by ppr:{devices}:node" in caught.value.fix


def test_setters_keep_the_launchers_values_and_log_lightnings(caplog: pytest.LogCaptureFixture) -> None:
    env = DistinitEnvironment(block(2))
    with caplog.at_level(logging.DEBUG, logger="distinit.integrations"):
        env.set_global_rank(2)
        env.set_world_size(4)
        assert not caplog.records
        env.set_world_size(8)
        env.set_global_rank(0)
    assert (env.global_rank(), env.world_size()) == (2, 4)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * 2
    assert "world size 8" in caplog.records[0].getMessage() and "global rank 0" in caplog.records[1].getMessage()


def test_unknown_master_and_node_rank_are_errors_not_fallbacks() -> None:
    env = DistinitEnvironment(hydra(3, 4, 1, 2))
    with pytest.raises(IncompleteEnvError, match="MASTER_ADDR") as master:
        _ = env.main_address
    assert "mpiexec -genv MASTER_ADDR" in master.value.fix
    with pytest.raises(IncompleteEnvError, match="MASTER_PORT"):
        _ = env.main_port
    with pytest.raises(IncompleteEnvError, match="node rank") as node:
        env.node_rank()
    assert "unknown off rank 0's node" in node.value.what and "NODE_RANK" in node.value.fix


def test_a_verified_world_can_be_passed() -> None:
    world = env_from_scheduler(hydra(3, 4, 1, 2, NODE_RANK="1", **MASTER))
    env = DistinitEnvironment(env=world)
    assert (env.env is world, env.node_rank(), env.main_address, env.main_port) == (True, 1, "h0", 29500)
    with pytest.raises(ValueError, match="not both"):
        DistinitEnvironment({}, env=world)


def test_detect_and_external_processes() -> None:
    assert DistinitEnvironment.detect() is False
    single = DistinitEnvironment({})
    assert single.creates_processes_externally is False
    assert DistinitEnvironment(block(0)).creates_processes_externally is True
    os.environ.update(block(1))
    assert DistinitEnvironment.detect() is True
    os.environ["OMPI_COMM_WORLD_RANK"] = "x"  # broken, but a launcher is there: constructing says what is wrong
    assert DistinitEnvironment.detect() is True
