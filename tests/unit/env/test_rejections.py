"""Impossible worlds and hostile values that env_from_scheduler used to accept or crash on (issues 11 and 12).

Each row failed before its fix: the world resolved (and init would have hung or collided), or a
ValueError, RecursionError or pydantic ValidationError escaped instead of a SchedulerEnvError.
"""

from __future__ import annotations

import json
import os

import pytest

from distinit import cli, env_from_scheduler
from distinit.errors import ConflictingEnvError, MalformedEnvError, NotLaunchedError, SchedulerEnvError

BIG = "1" + "0" * 5000  # int() refuses more than 4300 digits with a bare ValueError
SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2"}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def _vertex(task: object, chief: object = ("h0:2222",), workers: object = ("h1:2222", "h2:2222")) -> dict[str, str]:
    spec = {"cluster": {"workerpool0": list(chief), "workerpool1": list(workers)}, "task": task}  # type: ignore[call-overload]
    return {"CLUSTER_SPEC": json.dumps(spec)}


IMPOSSIBLE = [
    pytest.param({**SRUN, "SLURM_NODEID": "3", "SLURM_NODELIST": "n[1-2]"}, ("SLURM_NODEID", "SLURM_NODELIST"),
                 id="slurm-nodeid-beyond-job-nodelist"),
    pytest.param({**SRUN, "SLURM_NODEID": "3", "SLURM_STEP_NODELIST": "n[1-2]"},
                 ("SLURM_NODEID", "SLURM_STEP_NODELIST"), id="slurm-nodeid-beyond-step-nodelist"),
    pytest.param({**SRUN, "SLURM_NODEID": "3", "SLURM_NNODES": "2"}, ("SLURM_NODEID", "SLURM_NNODES"),
                 id="slurm-nodeid-beyond-nnodes"),
    pytest.param({"RANK": "1", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}, ("LOCAL_RANK", "RANK"),
                 id="exported-local-rank-above-rank"),
    pytest.param({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK"),
                 id="openmpi-local-rank-above-rank"),
    pytest.param({"TORCHELASTIC_RUN_ID": "r", "RANK": "1", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                  "WORLD_SIZE": "8"}, ("LOCAL_RANK", "RANK"), id="torchrun-local-rank-above-rank"),
    pytest.param({**SRUN, "SLURM_PROCID": "1", "SLURM_LOCALID": "3", "SLURM_NTASKS": "8"},
                 ("SLURM_LOCALID", "SLURM_PROCID"), id="srun-local-rank-above-rank"),
    pytest.param({"JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_LOCAL_RANK": "0",
                  "JSM_NAMESPACE_LOCAL_SIZE": "2", "LSB_JOBID": "1",
                  "LSB_MCPU_HOSTS": "launch 1 h1 2 h2 2 h3 2 h4 2"},
                 ("LSB_MCPU_HOSTS", "JSM_NAMESPACE_LOCAL_SIZE", "JSM_NAMESPACE_SIZE"),
                 id="lsf-four-nodes-for-four-ranks"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "named"), IMPOSSIBLE)
def test_impossible_world_is_a_conflict(environ: dict[str, str], named: tuple[str, ...]) -> None:
    with pytest.raises(ConflictingEnvError) as caught:
        env_from_scheduler(environ)
    assert caught.value.variables[: len(named)] == named
    assert all(name in str(caught.value) for name in named)


def test_uneven_layout_with_many_nodes_is_still_possible() -> None:
    # 3 nodes holding 2 + 1 + 1 ranks: this node's 2 plus one on each other node fits a world of 4.
    env = env_from_scheduler({**OMPI, "NODE_RANK": "0", "OMPI_MCA_orte_num_nodes": "3"})
    assert (env.num_nodes, env.local_world_size, env.world_size) == (3, 2, 4)


HOSTILE = [
    pytest.param({"RANK": BIG, "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK", id="rank-5000-digits"),
    pytest.param({**SRUN, "SLURM_PROCID": BIG}, "SLURM_PROCID", id="procid-5000-digits"),
    pytest.param({**SRUN, "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": BIG}, "SLURM_STEP_TASKS_PER_NODE",
                 id="tasks-per-node-5000-digits"),
    pytest.param({**SRUN, "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": f"2(x{BIG})"},
                 "SLURM_STEP_TASKS_PER_NODE", id="tasks-per-node-repeat-5000-digits"),
    pytest.param({"PMIX_RANK": BIG}, "PMIX_RANK", id="pmix-rank-5000-digits"),
    pytest.param({**SRUN, "SLURM_STEP_NODELIST": f"n[{BIG}]"}, "SLURM_STEP_NODELIST", id="hostlist-bound-5000-digits"),
    pytest.param({"SM_HOSTS": f"[{BIG}]"}, "SM_HOSTS", id="json-int-5000-digits"),
    pytest.param({"SM_HOSTS": "[" * 3000}, "SM_HOSTS", id="json-3000-brackets"),
    pytest.param({"CLUSTER_SPEC": "[" * 3000}, "CLUSTER_SPEC", id="cluster-spec-3000-brackets"),
    pytest.param(_vertex({"type": "workerpool0", "index": 0}, chief=("h0:\u00b2",)), "CLUSTER_SPEC",
                 id="vertex-port-unicode-digit"),
    pytest.param({**SRUN, "SLURM_GTIDS": "0,\u0661"}, "SLURM_GTIDS", id="gtids-arabic-indic-digit"),
    pytest.param({"RANK": "\u00b2", "WORLD_SIZE": "2"}, "RANK", id="rank-superscript-two"),
    pytest.param({"LSB_MCPU_HOSTS": "a \u00b2 b 1", **OMPI, "JSM_NAMESPACE_RANK": "0"}, "LSB_MCPU_HOSTS",
                 id="lsf-slots-unicode-digit"),
    pytest.param(_vertex({"type": "workerpool0", "index": -1}), "CLUSTER_SPEC", id="vertex-index-minus-one"),
    pytest.param(_vertex({"type": "workerpool1", "index": -1}), "CLUSTER_SPEC",
                 id="vertex-workerpool1-minus-one-duplicates-chief"),
    pytest.param(_vertex({"type": "workerpool0", "index": 1}), "CLUSTER_SPEC",
                 id="vertex-chief-index-beyond-its-pool"),
    pytest.param(_vertex({"type": "workerpool1", "index": True}), "CLUSTER_SPEC", id="vertex-bool-index"),
    pytest.param(_vertex({"type": "workerpool0", "index": 0}, chief=("",)), "CLUSTER_SPEC", id="vertex-empty-host"),
    pytest.param(_vertex({"type": "workerpool0", "index": 0}, chief=(":2222",)), "CLUSTER_SPEC",
                 id="vertex-port-without-host"),
    pytest.param({**OMPI, "AZ_BATCH_MASTER_NODE": ":6000"}, "AZ_BATCH_MASTER_NODE", id="azure-master-without-host"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "variable"), HOSTILE)
def test_hostile_value_is_a_scheduler_env_error_naming_it(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(SchedulerEnvError) as caught:
        env_from_scheduler(environ)
    assert variable in caught.value.variables
    assert len(str(caught.value)) < 2000, "the message quotes a bounded part of the value"


def test_unicode_nproc_per_node_is_a_pre_launch_pod() -> None:
    # '²'.isdigit() is True but int('²') raises: it is not a number, so not "one process per node" either.
    with pytest.raises(NotLaunchedError) as caught:
        env_from_scheduler({"PET_NPROC_PER_NODE": "\u00b2", "RANK": "0", "WORLD_SIZE": "2"})
    assert caught.value.variables[0] == "PET_NPROC_PER_NODE"


def test_exported_master_port_of_5000_digits() -> None:
    with pytest.raises(MalformedEnvError) as caught:
        env_from_scheduler({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": BIG})
    assert caught.value.variables == ("MASTER_PORT",)


def test_cli_exits_2_without_traceback(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_", "SM_", "PET_", "AZ_", "LSB_", "PBS_")):
            monkeypatch.delenv(name)
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", BIG)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["env"]) == 2
    err = capsys.readouterr().err
    assert "MalformedEnvError" in err and "RANK" in err
    assert "Traceback" not in err
