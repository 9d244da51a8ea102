"""scheduler_env presets against real-launcher captures (tests/integration/launchers/captures/*.json).

Every capture of a plain launch is mapped to the preset call describing the same layout. The preset
must produce the same variable names as the real launcher (minus the harness's own settings) and the
same values for everything the layout decides (ranks, sizes, node lists, tasks-per-node strings).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distinit.testing import scheduler_env

CAPTURES = Path(__file__).resolve().parents[2] / "integration" / "launchers" / "captures"

#: Set by the capture harness, not by the launcher (see the captures README and launchers.md).
HARNESS_ONLY = {"SLURM_CONF", "OMPI_MCA_orte_launch_agent", "OMPI_MCA_plm_rsh_agent"}

LAYOUT_VALUES = {
    "slurm": [
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_GTIDS",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_STEP_NUM_NODES",
        "SLURM_TASKS_PER_NODE",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_JOB_CPUS_PER_NODE",
        "SLURM_CPUS_ON_NODE",
        "SLURM_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_NODELIST",
        "SLURMD_NODENAME",
        "SLURM_TOPOLOGY_ADDR",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_DISTRIBUTION",
        "SLURM_MPI_TYPE",
        "PMI_RANK",
        "PMI_SIZE",
        "PMIX_RANK",
        "SLURM_PMIX_MAPPING_SERV",
        "SLURM_TOPOLOGY_ADDR_PATTERN",
        "SLURM_PRIO_PROCESS",
        "SLURM_UMASK",
    ],
    "openmpi": [
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_NODE_RANK",
        "OMPI_MCA_ess_base_vpid",
        "OMPI_MCA_orte_ess_node_rank",
        "OMPI_MCA_orte_ess_num_procs",
        "OMPI_MCA_orte_num_nodes",
        "OMPI_APP_CTX_NUM_PROCS",
        "OMPI_MCA_ess_base_num_procs",
        "OMPI_FIRST_RANKS",
        "PMIX_RANK",
        "OMPI_NUM_APP_CTX",
        "OMPI_MCA_ess",
        "OMPI_MCA_pmix",
    ],
    "mpich": ["MPI_LOCALNRANKS", "MPI_LOCALRANKID", "PMI_RANK", "PMI_SIZE"],
    "torchrun": [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "MASTER_ADDR",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_SIGNALS_TO_HANDLE",
    ],
}

SHAPES = [
    pytest.param("slurm-1node", "slurm", {"nodes": 1, "tasks_per_node": 2}, id="slurm-1node"),
    pytest.param(
        "slurm-block", "slurm", {"nodes": 2, "tasks_per_node": 2, "ntasks_per_node_flag": True}, id="slurm-block"
    ),
    pytest.param(
        "slurm-cyclic",
        "slurm",
        {"nodes": 2, "tasks_per_node": 2, "ntasks_per_node_flag": True, "distribution": "cyclic"},
        id="slurm-cyclic",
    ),
    pytest.param("slurm-uneven", "slurm", {"nodes": 2, "tasks_per_node": [2, 1]}, id="slurm-uneven"),
    pytest.param("slurm-3node", "slurm", {"nodes": 3, "tasks_per_node": [2, 1, 1]}, id="slurm-3node"),
    pytest.param(
        "slurm-pmi2",
        "slurm",
        {"nodes": 2, "tasks_per_node": 2, "ntasks_per_node_flag": True, "mpi": "pmi2"},
        id="slurm-pmi2",
    ),
    pytest.param("slurm-pmix", "slurm", {"nodes": 2, "tasks_per_node": [2, 1], "mpi": "pmix"}, id="slurm-pmix"),
    pytest.param("openmpi-1node", "openmpi", {"nodes": 1, "tasks_per_node": 3}, id="openmpi-1node"),
    pytest.param("openmpi-2node", "openmpi", {"nodes": 2, "tasks_per_node": 2}, id="openmpi-2node"),
    pytest.param(
        "openmpi-2node-bynode",
        "openmpi",
        {"nodes": 2, "tasks_per_node": 2, "distribution": "cyclic"},
        id="openmpi-bynode",
    ),
    pytest.param("mpich-1node", "mpich", {"nodes": 1, "tasks_per_node": 3}, id="mpich-1node"),
    pytest.param("mpich-2node", "mpich", {"nodes": 2, "tasks_per_node": 2}, id="mpich-2node"),
    pytest.param(
        "mpich-2node-rr", "mpich", {"nodes": 2, "tasks_per_node": [2, 1], "distribution": "cyclic"}, id="mpich-2node-rr"
    ),
    pytest.param(
        "torchrun-1node", "torchrun", {"nodes": 1, "tasks_per_node": 3, "rdzv": "standalone"}, id="torchrun-1node"
    ),
    pytest.param(
        "torchrun-static-2node", "torchrun", {"nodes": 2, "tasks_per_node": 2, "rdzv": "static"}, id="torchrun-static"
    ),
    pytest.param("torchrun-c10d-2node", "torchrun", {"nodes": 2, "tasks_per_node": [1, 2]}, id="torchrun-c10d-2node"),
]


def _hostnames(capture: list[dict[str, str]], nodes: int) -> list[str] | None:
    names: dict[int, str] = {}
    for task in capture:
        if "SLURMD_NODENAME" in task and "SLURM_NODEID" in task:
            names[int(task["SLURM_NODEID"])] = task["SLURMD_NODENAME"]
    return [names[n] for n in range(nodes)] if len(names) == nodes else None


@pytest.mark.parametrize(("shape", "launcher", "layout"), SHAPES)
def test_preset_matches_the_real_launcher(shape: str, launcher: str, layout: dict[str, Any]) -> None:
    path = CAPTURES / f"{shape}.json"
    if not path.exists():
        pytest.skip(f"no real-launcher capture {path.name} yet (written by tests/integration/launchers)")
    capture: list[dict[str, str]] = json.loads(path.read_text())
    hostnames = _hostnames(capture, layout["nodes"])
    for rank, real in enumerate(capture):
        preset = scheduler_env(launcher, rank=rank, hostnames=hostnames, **layout)  # type: ignore[arg-type]
        real_names = set(real) - HARNESS_ONLY
        assert set(preset) - real_names == set(), f"{shape} rank {rank}: variables the launcher does not set"
        assert real_names - set(preset) == set(), f"{shape} rank {rank}: variables the preset misses"
        for name in LAYOUT_VALUES[launcher]:
            assert preset.get(name) == real.get(name), f"{shape} rank {rank}: {name}"
