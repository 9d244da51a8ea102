"""Table tests of ``DistEnv.launched`` and ``DistEnv.agent_store``: what the launcher itself says it started.

Two layers. Whole environments (``env_from_scheduler``): every launcher's count, with its ``sources`` and the
words init's timeout prints, and torchrun's agent-store flag. The count's own reads (``Vars.first_count`` and
the precedence in ``_resolve``), over values no resolution would accept: a garbled count is unknown, never an
error, because it only feeds a message.
"""

from __future__ import annotations

import pytest

from distinit.env import DistEnv, env_from_scheduler
from distinit.env._draft import Draft, Vars
from distinit.env._resolve import _launched
from tests.unit.env.cases import ALLOC, ORTED_STEP_NODE1, hydra, ompi, srun, torchrun

MV2 = {
    "MV2_COMM_WORLD_RANK": "3",
    "MV2_COMM_WORLD_SIZE": "4",
    "MV2_COMM_WORLD_LOCAL_RANK": "1",
    "MV2_COMM_WORLD_LOCAL_SIZE": "2",
}


def step(**extra: str) -> dict[str, str]:
    """Task 1 of a 2-task srun step on n[1-2]."""
    return srun(procid=1, localid=0, nodeid=1, ntasks=2, tasks_per_node="1(x2)", nodelist="n[1-2]", nnodes=2,
                gtids="1", **extra)  # fmt: skip


TORCH_VARIABLES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
}  # fmt: skip
LAUNCHERS = [
    pytest.param(
        torchrun(1, 6, 1, 2, 0, 3), 6, ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"),
        "torchrun: LOCAL_WORLD_SIZE=2 x 3 node(s)", id="torchrun",
    ),
    pytest.param(
        # The integration test's world: WORLD_SIZE=4 forced where torchrun started 2. Not an error here.
        torchrun(1, 4, 1, 2, 0, 1), 2, ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"),
        "torchrun: LOCAL_WORLD_SIZE=2 x 1 node(s)", id="torchrun-started-fewer-than-WORLD_SIZE",
    ),
    pytest.param(
        {k: v for k, v in torchrun(1, 4, 1, 2, 0, 2).items() if k != "GROUP_WORLD_SIZE"}, None, None, "",
        id="torchrun-without-GROUP_WORLD_SIZE-is-unknown",
    ),
    pytest.param(
        # The SLURM_STEP_NUM_TASKS around a worker counts torchrun's agents, never its workers.
        {**step(), **torchrun(1, 4, 1, 2, 0, 2)}, 4, ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"),
        "torchrun: LOCAL_WORLD_SIZE=2 x 2 node(s)", id="torchrun-inside-srun-counts-its-workers",
    ),
    pytest.param(
        {**step(), **{k: v for k, v in torchrun(1, 4, 1, 2, 0, 2).items() if k != "LOCAL_WORLD_SIZE"}},
        None, None, "", id="torchrun-inside-srun-without-its-count-is-unknown-not-slurms",
    ),
    pytest.param(
        ompi(1, 4, 1, 2), 4, ("OMPI_COMM_WORLD_SIZE",), "OMPI_COMM_WORLD_SIZE=4", id="mpirun",
    ),
    pytest.param(
        {**ompi(3, 4, 1, 2), **ORTED_STEP_NODE1}, 4, ("OMPI_COMM_WORLD_SIZE",), "OMPI_COMM_WORLD_SIZE=4",
        id="mpirun-inside-slurm-daemon-step-not-the-step-count",
    ),
    pytest.param(MV2, 4, ("MV2_COMM_WORLD_SIZE",), "MV2_COMM_WORLD_SIZE=4", id="mvapich2"),
    pytest.param(hydra(1, 2, 1, 2), 2, ("PMI_SIZE",), "PMI_SIZE=2", id="hydra"),
    pytest.param(
        step(PMI_RANK="1", PMI_SIZE="2", PMI_JOBID="4242.0"), 2, ("PMI_SIZE",), "PMI_SIZE=2",
        id="srun-mpi-pmi2-PMI_SIZE-first",
    ),
    pytest.param(step(), 2, ("SLURM_STEP_NUM_TASKS",), "SLURM_STEP_NUM_TASKS=2", id="srun-step"),
    pytest.param(
        {**step(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, 2, ("SLURM_STEP_NUM_TASKS",),
        "SLURM_STEP_NUM_TASKS=2", id="exported-RANK-in-srun-step",
    ),
    pytest.param(ALLOC, None, None, "", id="batch-script-allocation-is-not-a-count"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, None, None, "", id="exported-RANK-alone"),
    pytest.param({}, None, None, "", id="not-launched"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "count", "sources", "words"), LAUNCHERS)
def test_launched_per_launcher(
    environ: dict[str, str], count: int | None, sources: tuple[str, ...] | None, words: str
) -> None:
    env = env_from_scheduler(environ, strict=False)  # a batch script is one process then, not an error
    assert env.launched == count
    assert env.sources.get("launched") == sources
    assert env.launched_from() == words
    assert set(env.to_environ()) <= TORCH_VARIABLES  # nothing new is exported


AGENT_STORE = [
    pytest.param(torchrun(0, 2, 0, 2, 0, 1), True, ("TORCHELASTIC_USE_AGENT_STORE",), id="torchrun-agent-store"),
    pytest.param(
        {**torchrun(0, 2, 0, 2, 0, 1), "TORCHELASTIC_USE_AGENT_STORE": "False"}, False, None, id="torchrun-False",
    ),
    pytest.param(
        {k: v for k, v in torchrun(0, 2, 0, 2, 0, 1).items() if k != "TORCHELASTIC_USE_AGENT_STORE"}, False, None,
        id="torchrun-unset",
    ),
    # torch compares with str(True): anything else is no agent store, as torch itself reads it.
    pytest.param({**torchrun(0, 2, 0, 2, 0, 1), "TORCHELASTIC_USE_AGENT_STORE": "true"}, False, None, id="lowercase"),
    pytest.param({**torchrun(0, 2, 0, 2, 0, 1), "TORCHELASTIC_USE_AGENT_STORE": "1"}, False, None, id="one"),
    pytest.param({**torchrun(0, 2, 0, 2, 0, 1), "TORCHELASTIC_USE_AGENT_STORE": ""}, False, None, id="empty"),
    pytest.param(
        {**torchrun(0, 2, 0, 2, 0, 1), "TORCHELASTIC_USE_AGENT_STORE": " True "}, False, None, id="spaces",
    ),
    # Only a torchrun worker meets its agent's store: the flag leaked into another launcher's world is ignored.
    pytest.param({**ompi(1, 4, 1, 2), "TORCHELASTIC_USE_AGENT_STORE": "True"}, False, None, id="leaked-into-mpirun"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "agent_store", "sources"), AGENT_STORE)
def test_agent_store(environ: dict[str, str], agent_store: bool, sources: tuple[str, ...] | None) -> None:
    env = env_from_scheduler(environ)
    assert env.agent_store is agent_store
    assert set(env.to_environ()) <= TORCH_VARIABLES
    assert env.sources.get("agent_store") == sources


GARBAGE = ["", " ", "0", "00", "-1", "+4", "abc", "4.0", "1_0", "4 4", "\u0663", "\uff14", "\u00b2", "2147483648"]


@pytest.mark.parametrize("value", GARBAGE, ids=[repr(value) for value in GARBAGE])
def test_a_garbled_count_is_unknown(value: str) -> None:
    assert Vars({"OMPI_COMM_WORLD_SIZE": value}).first_count("OMPI_COMM_WORLD_SIZE") is None


@pytest.mark.parametrize(
    ("value", "count"),
    [
        pytest.param("4", 4, id="plain"),
        pytest.param(" 4\n", 4, id="surrounding-whitespace"),
        pytest.param("007", 7, id="leading-zeros"),
        pytest.param("2147483647", 2**31 - 1, id="int-max"),
    ],
)
def test_a_count_is_a_positive_decimal(value: str, count: int) -> None:
    assert Vars({"PMI_SIZE": value}).first_count("PMI_SIZE") == ("PMI_SIZE", count)


def _said(environ: dict[str, str], launcher: str = "env") -> tuple[int | None, tuple[str, ...] | None]:
    draft = Draft(launcher="torchrun" if launcher == "torchrun" else "env", rank=0, world_size=1)
    _launched(Vars(environ), draft)
    return draft.launched, draft.sources.get("launched")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"OMPI_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_SIZE": "5", "PMI_SIZE": "6", "SLURM_STEP_NUM_TASKS": "7"},
            (4, ("OMPI_COMM_WORLD_SIZE",)), id="Open-MPI-first",
        ),
        pytest.param(
            {"MV2_COMM_WORLD_SIZE": "5", "PMI_SIZE": "6", "SLURM_STEP_NUM_TASKS": "7"},
            (5, ("MV2_COMM_WORLD_SIZE",)), id="then-MVAPICH2",
        ),
        pytest.param({"PMI_SIZE": "6", "SLURM_STEP_NUM_TASKS": "7"}, (6, ("PMI_SIZE",)), id="then-PMI"),
        pytest.param({"SLURM_STEP_NUM_TASKS": "7"}, (7, ("SLURM_STEP_NUM_TASKS",)), id="then-the-srun-step"),
        pytest.param(
            {"OMPI_COMM_WORLD_SIZE": "abc", "MV2_COMM_WORLD_SIZE": "0", "PMI_SIZE": "-1", "SLURM_STEP_NUM_TASKS": "7"},
            (7, ("SLURM_STEP_NUM_TASKS",)), id="garbled-counts-are-skipped",
        ),
        pytest.param({"PMI_SIZE": "\u0663"}, (None, None), id="non-ASCII-digit"),
        pytest.param({"SLURM_NTASKS": "8", "SLURM_NPROCS": "8"}, (None, None), id="allocation-only"),
        pytest.param({}, (None, None), id="nothing"),
    ],
)  # fmt: skip
def test_precedence_outside_torchrun(
    environ: dict[str, str], expected: tuple[int | None, tuple[str, ...] | None]
) -> None:
    assert _said(environ) == expected


def test_a_torchrun_worker_is_not_counted_by_the_launchers_around_it() -> None:
    assert _said({"OMPI_COMM_WORLD_SIZE": "4", "SLURM_STEP_NUM_TASKS": "2"}, launcher="torchrun") == (None, None)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        pytest.param({}, "", id="unknown"),
        pytest.param({"launched": 4}, "launched=4", id="built-by-hand-without-sources"),
        pytest.param({"launched": 4, "sources": {"launched": ("PMI_SIZE",)}}, "PMI_SIZE=4", id="one-variable"),
        pytest.param(
            {"launched": 4, "num_nodes": 2, "sources": {"launched": ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE")}},
            "env: LOCAL_WORLD_SIZE=2 x 2 node(s)",
            id="a-product",
        ),
    ],
)
def test_launched_from_derives_the_words_from_sources(fields: dict[str, object], words: str) -> None:
    env = DistEnv.model_validate({"rank": 0, "local_rank": 0, "world_size": 8, "launcher": "env", **fields})
    assert env.launched_from() == words


def test_defaults_keep_hand_built_worlds_valid_and_launched_may_be_below_world_size() -> None:
    env = DistEnv(rank=0, local_rank=0, world_size=4, launcher="torchrun")
    assert (env.launched, env.agent_store) == (None, False)
    assert DistEnv(rank=0, local_rank=0, world_size=4, launcher="slurm", launched=2).launched == 2
    with pytest.raises(ValueError, match="launched"):
        DistEnv(rank=0, local_rank=0, world_size=4, launcher="slurm", launched=0)
