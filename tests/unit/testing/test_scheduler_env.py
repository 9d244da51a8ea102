"""scheduler_env presets: layouts, hostile arguments, and agreement with env_from_scheduler."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from distinit.env import env_from_scheduler
from distinit.errors import NotLaunchedError
from distinit.testing import LAUNCHERS, compress_hostlist, scheduler_env
from distinit.testing._scheduler import compress_counts

ROUND_TRIP = [
    pytest.param("slurm", {"nodes": 2, "tasks_per_node": 8, "rank": 11}, (11, 16, 3, 8), id="slurm-2x8-r11"),
    pytest.param("slurm", {"nodes": 3, "tasks_per_node": [2, 1, 1], "rank": 3}, (3, 4, 0, 1), id="slurm-uneven"),
    pytest.param(
        "slurm", {"nodes": 2, "tasks_per_node": 2, "rank": 1, "distribution": "cyclic"}, (1, 4, 0, 2), id="slurm-cyclic"
    ),
    pytest.param("slurm", {"nodes": 2, "tasks_per_node": 2, "rank": 3, "mpi": "pmi2"}, (3, 4, 1, 2), id="slurm-pmi2"),
    pytest.param(
        "slurm", {"nodes": 2, "tasks_per_node": [2, 1], "rank": 2, "mpi": "pmix"}, (2, 3, 0, 1), id="slurm-pmix"
    ),
    pytest.param("openmpi", {"nodes": 2, "tasks_per_node": 2, "rank": 3}, (3, 4, 1, 2), id="openmpi-2x2"),
    pytest.param(
        "openmpi",
        {"nodes": 2, "tasks_per_node": 2, "rank": 1, "distribution": "cyclic"},
        (1, 4, 0, 2),
        id="openmpi-bynode",
    ),
    pytest.param("mpich", {"nodes": 2, "tasks_per_node": [2, 1], "rank": 2}, (2, 3, 0, 1), id="mpich-uneven"),
    pytest.param("torchrun", {"nodes": 2, "tasks_per_node": [1, 2], "rank": 2}, (2, 3, 1, 2), id="torchrun-c10d"),
    pytest.param("torchrun", {"tasks_per_node": 4, "rank": 3, "rdzv": "standalone"}, (3, 4, 3, 4), id="torchrun-1node"),
    pytest.param("lsf", {"nodes": 2, "tasks_per_node": 4, "rank": 5}, (5, 8, 1, 4), id="lsf-jsrun-2x4"),
    pytest.param("pals", {"nodes": 2, "tasks_per_node": 4, "rank": 6}, (6, 8, 2, 4), id="pals-2x4"),
    pytest.param("kubeflow", {"nodes": 3, "rank": 2}, (2, 3, 0, 1), id="kubeflow-legacy-3pods"),
    pytest.param("sagemaker", {"nodes": 2, "rank": 1}, (1, 2, 0, 1), id="sagemaker-2hosts"),
]


@pytest.mark.parametrize(("launcher", "layout", "expected"), ROUND_TRIP)
def test_env_from_scheduler_reads_the_preset_back(
    launcher: str, layout: dict[str, Any], expected: tuple[int, ...]
) -> None:
    world = env_from_scheduler(scheduler_env(launcher, **layout))  # type: ignore[arg-type]
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size) == expected
    assert world.launcher == launcher


def test_kubeflow_with_nproc_per_node_is_a_pre_launch_environment() -> None:
    env = scheduler_env("kubeflow", nodes=2, rank=1, nproc_per_node=4)
    assert env["PET_NPROC_PER_NODE"] == "4"
    assert env["WORLD_SIZE"] == "8"
    with pytest.raises(NotLaunchedError):
        env_from_scheduler(env)


def test_slurm_variables_for_the_issue_example() -> None:
    env = scheduler_env("slurm", nodes=2, tasks_per_node=8, rank=11)
    assert env["SLURM_PROCID"] == "11"
    assert env["SLURM_LOCALID"] == "3"
    assert env["SLURM_NODEID"] == "1"
    assert env["SLURM_STEP_TASKS_PER_NODE"] == "8(x2)"
    assert env["SLURM_STEP_NODELIST"] == "node[1-2]"
    assert env["SLURM_GTIDS"] == "8,9,10,11,12,13,14,15"
    assert "SLURM_NTASKS_PER_NODE" not in env
    assert scheduler_env("slurm", nodes=2, tasks_per_node=8, ntasks_per_node_flag=True)["SLURM_NTASKS_PER_NODE"] == "8"


def test_sagemaker_hosts_are_sorted_lexicographically() -> None:
    env = scheduler_env("sagemaker", nodes=11, rank=2)
    hosts = json.loads(env["SM_HOSTS"])
    assert hosts[:4] == ["algo-1", "algo-10", "algo-11", "algo-2"]
    assert env["SM_CURRENT_HOST"] == "algo-11"


def test_node_files_are_written_only_when_asked(tmp_path: Path) -> None:
    env = scheduler_env("pals", nodes=2, tasks_per_node=2, hostnames=["x1000c0s0b0n0", "x1000c0s0b0n1"])
    assert not env["PBS_NODEFILE"].startswith(str(tmp_path))
    env = scheduler_env("pals", nodes=2, tasks_per_node=2, hostnames=["a", "b"], files_dir=str(tmp_path))
    assert Path(env["PBS_NODEFILE"]).read_text() == "a\nb\n"
    lsf = scheduler_env("lsf", nodes=2, tasks_per_node=2, hostnames=["h1", "h2"], files_dir=str(tmp_path))
    assert Path(lsf["LSB_DJOB_HOSTFILE"]).read_text().split() == ["batch1", "h1", "h1", "h2", "h2"]
    assert lsf["LSB_MCPU_HOSTS"] == "batch1 1 h1 2 h2 2"


BAD = [
    pytest.param("nope", {}, "no scheduler_env preset for launcher 'nope'", id="unknown-launcher"),
    pytest.param("slurm", {"rank": 4, "tasks_per_node": 4}, "rank=4 is outside the world of 4", id="rank-too-big"),
    pytest.param("slurm", {"rank": -1}, "rank=-1", id="negative-rank"),
    pytest.param("slurm", {"nodes": 0}, "nodes must be", id="zero-nodes"),
    pytest.param("slurm", {"nodes": 2, "tasks_per_node": [1]}, "lists 1 nodes but nodes=2", id="short-list"),
    pytest.param("slurm", {"tasks_per_node": "8"}, "tasks_per_node must be", id="string-count"),
    pytest.param("slurm", {"rdzv": "c10d"}, "unknown option(s) ['rdzv']", id="option-of-another-launcher"),
    pytest.param("slurm", {"nodes": 2, "hostnames": ["a", ""]}, "hostnames must give 2", id="empty-hostname"),
    pytest.param("slurm", {"distribution": "plane"}, "distribution must be", id="bad-distribution"),
    pytest.param("slurm", {"mpi": "pmi1"}, "mpi must be", id="bad-mpi"),
    pytest.param("sagemaker", {"tasks_per_node": 2}, "once per host", id="sagemaker-multi-task"),
    pytest.param("torchrun", {"rdzv": "etcd"}, "rdzv must be", id="bad-rdzv"),
]


@pytest.mark.parametrize(("launcher", "layout", "message"), BAD)
def test_rejects(launcher: str, layout: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        scheduler_env(launcher, **layout)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        pytest.param(["dnode1", "dnode2", "dnode3"], "dnode[1-3]", id="range"),
        pytest.param(["dnode2"], "dnode2", id="single"),
        pytest.param(["n01", "n02", "n05"], "n[01-02,05]", id="padded-gap"),
        pytest.param(["login", "gpu1", "gpu2"], "login,gpu[1-2]", id="mixed"),
        pytest.param(["a3", "a1"], "a3,a1", id="order-kept"),
    ],
)
def test_compress_hostlist(hosts: list[str], expected: str) -> None:
    assert compress_hostlist(hosts) == expected


def test_compress_counts() -> None:
    assert compress_counts([2, 2, 1]) == "2(x2),1"
    assert compress_counts([2, 1, 1]) == "2,1(x2)"
    assert compress_counts([4]) == "4"


def test_every_preset_gives_only_strings() -> None:
    for launcher in LAUNCHERS:
        env = scheduler_env(launcher, nodes=2, rank=1)  # type: ignore[arg-type]
        assert env
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
