"""The environment never guesses a node identity silently (issue 13, item 2).

Every node rank or master address derived by a rule carries a note naming the rule; what no rule can
derive stays unknown with a note saying why; a derived node rank is never at or past the node count;
and an unknown MASTER_ADDR in a multi-node world is an error from ``DistEnv.export()``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from distinit import DistEnv, env_from_scheduler
from distinit.errors import IncompleteEnvError, NotLaunchedError
from tests.unit.env.cases import ompi

CAPTURES = Path(__file__).resolve().parents[2] / "integration" / "launchers" / "captures"
#: Rules whose answer is certain, not an assumption about the layout.
CERTAIN = {"rule: whole world on this node", "rule: not launched"}


def _capture(name: str) -> list[DistEnv]:
    tasks = json.loads((CAPTURES / f"{name}.json").read_text())
    return [env_from_scheduler(task) for task in tasks]


def test_map_by_node_gives_round_robin_node_ranks() -> None:
    # Real Open MPI 4.1, --host a:2,b:2 --map-by node: ranks 0 and 2 on a, 1 and 3 on b. The block guess
    # put rank 3 on node 1 and left rank 2's node unknown with no note.
    worlds = _capture("openmpi-2node-bynode")
    assert [w.node_rank for w in worlds] == [0, 1, 0, 1]
    for world in worlds[1:]:
        assert world.sources["node_rank"][0] == "rule: round-robin layout, RANK % nodes"
        assert any("round-robin" in note and "OMPI_MCA_rmaps_base_mapping_policy" in note for note in world.notes)


def test_hydra_uneven_never_puts_a_rank_past_the_node_count() -> None:
    # R1: hydra -hosts a:3,b:1 (2 nodes) gave rank 3 node_rank=3 by the block rule.
    worlds = _capture("mpich-2node-uneven")
    assert [w.node_rank for w in worlds] == [0, 0, 0, None]
    lone = worlds[3]
    assert any("no node count" in note and "setup()" in note for note in lone.notes), lone.notes
    assert "NODE_RANK" not in lone.to_environ()


def test_mpirun_on_a_subset_of_the_allocation_names_the_daemon_steps_first_node() -> None:
    # R4: salloc -N3 (dnode1-3); mpirun --host dnode2:2,dnode3:2. MASTER_ADDR was the job's first node, dnode1,
    # which runs no rank; Open MPI's node count (2 = the daemon step's nodes) shows every rank is on a daemon node.
    worlds = _capture("openmpi-in-slurm-subset")
    assert {w.master_addr for w in worlds} == {"dnode2"}
    assert [w.node_rank for w in worlds] == [0, 0, 1, 1]
    assert all(any("MASTER_ADDR=dnode2 by rule" in note for note in w.notes) for w in worlds)


def test_sbatch_rank_off_the_batch_node_finds_mpiruns_own_node() -> None:
    # A real sbatch: mpirun runs ranks on the batch node (n1) and starts daemons on n2-n3 only.
    slurm = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "n[2-3]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_NUM_TASKS": "2",
    }
    env = env_from_scheduler({**ompi(5, 6, 1, 2, OMPI_MCA_orte_num_nodes="3"), **slurm})
    assert env.master_addr == "n1"
    assert env.node_rank == 2
    without_count = env_from_scheduler({**ompi(5, 6, 1, 2), **slurm})
    assert without_count.master_addr is None
    assert any("MASTER_ADDR is unknown" in note and "mpirun -x MASTER_ADDR" in note for note in without_count.notes)


@pytest.mark.parametrize(
    ("policy", "node"),
    [
        ({"OMPI_MCA_rmaps_base_mapping_policy": "node"}, 1),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "NODE:PE=2"}, 1),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "bynode"}, 1),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "slot", "OMPI_MCA_rmaps_base_ranking_policy": "node"}, 1),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "node", "OMPI_MCA_rmaps_base_ranking_policy": "slot"}, None),
        ({}, None),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "socket"}, None),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "ppr:2:node"}, None),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "core:span"}, None),
        ({"OMPI_MCA_rmaps_base_mapping_policy": "seq"}, None),
        ({"OMPI_MCA_rmaps_base_mapping_policy": ""}, None),
    ],
)
def test_mapping_policy_picks_the_rule(policy: dict[str, str], node: int | None) -> None:
    # Rank 1 of 4 on 2 nodes with local rank 0: node 1 round-robin; block puts it at offset 1 of 2 (no fit).
    env = env_from_scheduler(ompi(1, 4, 0, 2, OMPI_MCA_orte_num_nodes="2", **policy))
    assert env.node_rank == node
    if node is None:
        assert any("node_rank is unknown" in note and "setup()" in note for note in env.notes), env.notes


def test_block_rule_is_noted_and_bounded_by_the_node_count() -> None:
    env = env_from_scheduler(ompi(7, 8, 1, 2, OMPI_MCA_orte_num_nodes="4"))
    assert env.node_rank == 3
    assert any("node_rank=3 by the block rule" in note for note in env.notes)
    uneven = env_from_scheduler(ompi(7, 8, 1, 2, OMPI_MCA_orte_num_nodes="3"))
    assert uneven.node_rank is None
    assert any("the nodes differ" in note for note in uneven.notes), uneven.notes


def test_exported_node_rank_replaces_a_rule() -> None:
    env = env_from_scheduler(ompi(1, 4, 0, 2, OMPI_MCA_orte_num_nodes="2", NODE_RANK="1"))
    assert env.node_rank == 1
    assert env.sources["node_rank"] == ("NODE_RANK",)


def test_explicit_torch_variables_without_node_rank_are_noted() -> None:
    env = env_from_scheduler(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h0"}
    )
    assert env.node_rank is None
    assert any("without NODE_RANK" in note and "setup()" in note for note in env.notes), env.notes
    whole = env_from_scheduler({"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})
    assert (whole.node_rank, whole.num_nodes) == (0, 1)


@pytest.mark.parametrize("name", sorted(path.stem for path in CAPTURES.glob("*.json")))
def test_every_rule_derived_identity_is_noted(name: str) -> None:
    tasks = json.loads((CAPTURES / f"{name}.json").read_text())
    for task in tasks:
        try:
            env = env_from_scheduler(task)
        except NotLaunchedError:  # the batch script and salloc shell; test_captures covers them
            continue
        notes = " ".join(env.notes)
        node_source = env.sources.get("node_rank", ("",))[0]
        if node_source.startswith("rule:") and node_source not in CERTAIN:
            assert f"node_rank={env.node_rank} by" in notes, (name, env.rank, env.notes)
        if env.node_rank is None:
            assert "node_rank is unknown" in notes, (name, env.rank, env.notes)
        if env.num_nodes is not None and env.node_rank is not None:
            assert env.node_rank < env.num_nodes


@pytest.fixture
def no_master() -> Iterator[None]:
    """os.environ without torch variables, restored afterwards (export() writes into it)."""
    saved = dict(os.environ)
    for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.usefixtures("no_master")
@pytest.mark.parametrize(
    ("environ", "fix"),
    [
        (ompi(3, 4, 1, 2), "mpirun -x MASTER_ADDR="),
        (
            {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
            "mpiexec -genv MASTER_ADDR",
        ),
    ],
)
def test_export_refuses_an_unknown_master_in_a_multi_node_world(environ: dict[str, str], fix: str) -> None:
    env = env_from_scheduler(environ)
    with pytest.raises(IncompleteEnvError, match="MASTER_ADDR") as caught:
        env.export()
    assert fix in caught.value.fix
    assert "RANK" not in os.environ, "nothing is exported from a refused world"
    with pytest.raises(IncompleteEnvError):
        env_from_scheduler(environ, export=True)


@pytest.mark.usefixtures("no_master")
def test_export_accepts_a_master_addr_already_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_from_scheduler(ompi(3, 4, 1, 2))
    monkeypatch.setenv("MASTER_ADDR", "h0")
    env.export()
    assert (os.environ["RANK"], os.environ["MASTER_ADDR"]) == ("3", "h0")


@pytest.mark.usefixtures("no_master")
def test_export_of_a_one_node_world_needs_no_master() -> None:
    env = env_from_scheduler(ompi(1, 2, 1, 2))
    env.export()
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
