"""Named environments for the resolver's table tests, modelled on real launcher captures.

Slurm rows follow the Slurm 22.05 captures in the env survey (section 3): step scope vs job scope,
daemon steps of mpirun/hydra, batch steps and salloc shells. Each GOOD row gives the environment and
the fields it must resolve to; each BAD row gives the error class and the variables the message names.
"""

from __future__ import annotations

from typing import Any

import pytest

from distinit.errors import (
    ConflictingEnvError,
    IncompleteEnvError,
    MalformedEnvError,
    NotLaunchedError,
)


def srun(
    *,
    job: str = "4242",
    step: str = "0",
    procid: int,
    localid: int,
    nodeid: int,
    ntasks: int,
    tasks_per_node: str,
    nodelist: str,
    nnodes: int,
    gtids: str,
    nodename: str | None = None,
    job_nodelist: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The variables srun gives one task (Slurm 22.05), job-scope values included."""
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_STEP_ID": step,
        "SLURM_STEPID": step,
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NODELIST": job_nodelist or nodelist,
        "SLURM_JOB_NODELIST": job_nodelist or nodelist,
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_NUM_NODES": str(nnodes),
        "SLURM_GTIDS": gtids,
        "SLURM_JOB_NAME": "train",
        "SLURM_CPUS_ON_NODE": "8",
    }
    if nodename is not None:
        env["SLURMD_NODENAME"] = nodename
    env.update(extra)
    return env


def ompi(rank: int, size: int, local: int, local_size: int, **extra: str) -> dict[str, str]:
    """Open MPI 4.1 mpirun's variables for one rank."""
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(local),  # a local rank across jobs, NOT a node index
        "OMPI_UNIVERSE_SIZE": str(size),
        "PMIX_RANK": str(rank),
        "OMPI_MCA_ess_base_jobid": "2785411073",
        "PMIX_NAMESPACE": "2785411073",
    }
    env.update(extra)
    return env


def hydra(rank: int, size: int, local: int, local_size: int, **extra: str) -> dict[str, str]:
    """MPICH 4.0 mpiexec.hydra's variables for one rank."""
    env = {
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(size),
        "MPI_LOCALRANKID": str(local),
        "MPI_LOCALNRANKS": str(local_size),
        "PMI_FD": "6",
    }
    env.update(extra)
    return env


def torchrun(
    rank: int, world: int, local: int, local_world: int, group: int, groups: int, **extra: str
) -> dict[str, str]:
    """torchrun 2.13 worker variables."""
    env = {
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group),
        "GROUP_WORLD_SIZE": str(groups),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    env.update(extra)
    return env


# A 2-node Slurm allocation gpu-node[01-02], --ntasks-per-node=4, job 4242 (survey section 3).
ALLOC = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NODELIST": "gpu-node[01-02]",
    "SLURM_NODELIST": "gpu-node[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "8",
    "SLURM_NPROCS": "8",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NAME": "train",
}
# The orted daemon step of mpirun in that allocation, as seen by ranks on node 1.
ORTED_STEP_NODE1 = {
    **ALLOC,
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NODELIST": "gpu-node[01-02]",
    "SLURM_GTIDS": "1",
    "SLURMD_NODENAME": "gpu-node02",
}
# hydra's proxy step: SLURM_NTASKS keeps the stale allocation value 8.
HYDRA_STEP_NODE1 = {**ORTED_STEP_NODE1, "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4"}

SAGEMAKER = {
    "SM_HOSTS": '["algo-1","algo-10","algo-11","algo-2"]',
    "SM_CURRENT_HOST": "algo-2",
    "SM_NUM_GPUS": "8",
    "SM_TRAINING_ENV": "{}",
}

GOOD: list[Any] = [
    # ---- nothing / single process -----------------------------------------------------------
    pytest.param({}, {"rank": 0, "world_size": 1, "launcher": "none", "master_addr": "127.0.0.1"}, id="empty"),
    pytest.param(
        {"PATH": "/usr/bin", "HOME": "/root", "HOSTNAME": "n1"},
        {"rank": 0, "world_size": 1, "launcher": "none"},
        id="unrelated-vars",
    ),
    pytest.param(
        {"PBS_JOBID": "1234.pbs01", "PBS_NODEFILE": "/var/spool/pbs/aux/1234.pbs01"},
        {"rank": 0, "world_size": 1, "launcher": "none"},
        id="pbs-batch-script-alone",
    ),
    pytest.param({"LSB_JOBID": "991"}, {"rank": 0, "world_size": 1, "launcher": "none"}, id="lsf-batch-script-alone"),
    pytest.param(
        {"WORLD_SIZE": "1"}, {"rank": 0, "world_size": 1, "local_rank": 0, "launcher": "env"}, id="world-size-1-alone"
    ),
    # ---- Slurm srun steps ---------------------------------------------------------------------
    pytest.param(
        srun(procid=0, localid=0, nodeid=0, ntasks=1, tasks_per_node="1", nodelist="gpu-node01", nnodes=1, gtids="0"),
        {
            "rank": 0,
            "world_size": 1,
            "local_world_size": 1,
            "node_rank": 0,
            "master_addr": "gpu-node01",
            "launcher": "slurm",
        },
        id="srun-single-task",
    ),
    pytest.param(
        srun(
            procid=5,
            localid=1,
            nodeid=1,
            ntasks=8,
            tasks_per_node="4(x2)",
            nodelist="gpu-node[01-02]",
            nnodes=2,
            gtids="4,5,6,7",
            nodename="gpu-node02",
        ),
        {
            "rank": 5,
            "local_rank": 1,
            "world_size": 8,
            "local_world_size": 4,
            "node_rank": 1,
            "num_nodes": 2,
            "master_addr": "gpu-node01",
            "launcher": "slurm",
            "job_id": "4242",
        },
        id="srun-2x4-block",
    ),
    pytest.param(
        srun(
            procid=6,
            localid=0,
            nodeid=3,
            ntasks=7,
            tasks_per_node="2(x3),1",
            nodelist="n[1-4]",
            nnodes=4,
            gtids="6",
            nodename="n4",
        ),
        {
            "rank": 6,
            "local_rank": 0,
            "world_size": 7,
            "local_world_size": 1,
            "node_rank": 3,
            "num_nodes": 4,
            "master_addr": "n1",
        },
        id="srun-uneven-2x3-1",
    ),
    pytest.param(
        srun(
            procid=3,
            localid=2,
            nodeid=0,
            ntasks=7,
            tasks_per_node="5,1(x2)",
            nodelist="n[01-03]",
            nnodes=3,
            gtids="0,1,3,4,5",
        ),
        {"rank": 3, "local_rank": 2, "local_world_size": 5, "node_rank": 0, "num_nodes": 3},
        id="srun-uneven-5-1x2-packing",
    ),
    pytest.param(
        srun(
            procid=3,
            localid=2,
            nodeid=0,
            ntasks=4,
            tasks_per_node="3,1",
            nodelist="gpu-node[01-02]",
            nnodes=2,
            gtids="0,2,3",
            SLURM_DISTRIBUTION="cyclic",
        ),
        {"rank": 3, "local_rank": 2, "local_world_size": 3, "node_rank": 0, "master_addr": "gpu-node01"},
        id="srun-cyclic-rank3-on-node0",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=0,
            nodeid=1,
            ntasks=4,
            tasks_per_node="3,1",
            nodelist="gpu-node[01-02]",
            nnodes=2,
            gtids="1",
            SLURM_DISTRIBUTION="cyclic",
        ),
        {"rank": 1, "local_rank": 0, "local_world_size": 1, "node_rank": 1},
        id="srun-cyclic-rank1-on-node1",
    ),
    pytest.param(
        srun(
            step="1",
            procid=1,
            localid=1,
            nodeid=0,
            ntasks=2,
            tasks_per_node="2",
            nodelist="gpu-node02",
            nnodes=1,
            gtids="0,1",
            nodename="gpu-node02",
            job_nodelist="gpu-node[01-02]",
            SLURM_NTASKS_PER_NODE="4",
        ),
        {
            "rank": 1,
            "world_size": 2,
            "node_rank": 0,
            "num_nodes": 1,
            "master_addr": "gpu-node02",
            "local_world_size": 2,
        },
        id="srun-subset-step-on-node02",
    ),
    pytest.param(
        srun(
            procid=0, localid=0, nodeid=0, ntasks=2, tasks_per_node="1(x2)", nodelist="node[18-19]", nnodes=2, gtids="0"
        ),
        {"master_addr": "node18", "rank": 0},
        id="srun-master-is-first-not-smallest",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=0,
            nodeid=1,
            ntasks=2,
            tasks_per_node="1(x2)",
            nodelist="ec[0-1]",
            nnodes=2,
            gtids="1",
            SLURM_NODE_ALIASES="ec0:10.0.0.5:ip-10-0-0-5,ec1:10.0.0.6:ip-10-0-0-6",
        ),
        {"master_addr": "10.0.0.5", "node_rank": 1},
        id="srun-cloud-node-aliases",
    ),
    pytest.param(
        srun(
            procid=0,
            localid=0,
            nodeid=0,
            ntasks=4,
            tasks_per_node="2(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="0,1",
            SLURM_DISTRIBUTION="arbitrary",
        ),
        {"master_addr": None, "rank": 0},
        id="srun-arbitrary-distribution-no-master",
    ),
    pytest.param(
        {
            **srun(
                procid=2, localid=0, nodeid=1, ntasks=3, tasks_per_node="2,1", nodelist="a1,b1", nnodes=2, gtids="2"
            ),
            "SLURM_HET_SIZE": "2",
            "SLURM_PACK_SIZE": "2",
        },
        {"rank": 2, "world_size": 3, "node_rank": 1, "local_world_size": 1},
        id="srun-het-group-0-1-one-world",
    ),
    pytest.param(
        {
            k: v
            for k, v in srun(
                procid=1, localid=1, nodeid=0, ntasks=2, tasks_per_node="2", nodelist="n1", nnodes=1, gtids="0,1"
            ).items()
            if k not in ("SLURM_STEP_ID",)
        },
        {"rank": 1, "launcher": "slurm"},
        id="srun-legacy-SLURM_STEPID-only",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=1,
            nodeid=0,
            ntasks=2,
            tasks_per_node="2",
            nodelist="n1",
            nnodes=1,
            gtids="0,1",
            SLURM_JOB_NAME="interactive",
        ),
        {"rank": 1, "launcher": "slurm"},
        id="salloc-then-srun-named-interactive",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=1,
            nodeid=0,
            ntasks=2,
            tasks_per_node="2",
            nodelist="n1",
            nnodes=1,
            gtids="0,1",
            SLURM_RESTART_COUNT="2",
        ),
        {"restart_count": 2},
        id="srun-requeued-restart-count",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=1,
            nodeid=0,
            ntasks=2,
            tasks_per_node="2",
            nodelist="n1",
            nnodes=1,
            gtids="0,1",
            MASTER_ADDR="10.1.1.1",
            MASTER_PORT="29400",
        ),
        {"master_addr": "10.1.1.1", "master_port": 29400},
        id="srun-explicit-master-wins",
    ),
    pytest.param(
        srun(
            procid=3,
            localid=1,
            nodeid=1,
            ntasks=4,
            tasks_per_node="2(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="2,3",
            RANK="3",
            WORLD_SIZE="4",
            LOCAL_RANK="1",
        ),
        {"rank": 3, "launcher": "slurm"},
        id="srun-enroot-hook-exports-agree",
    ),
    pytest.param(
        srun(
            procid=0,
            localid=0,
            nodeid=0,
            ntasks=1,
            tasks_per_node="1",
            nodelist="n1",
            nnodes=1,
            gtids="0",
            RANK="3",
            WORLD_SIZE="4",
            LOCAL_RANK="3",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29500",
        ),
        {"rank": 3, "world_size": 4, "launcher": "env"},
        id="spawner-inside-one-task-step",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=0,
            nodeid=1,
            ntasks=2,
            tasks_per_node="1(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="1",
            PMI_RANK="1",
            PMI_SIZE="2",
            PMI_JOBID="4242.0",
        ),
        {"rank": 1, "launcher": "slurm", "node_rank": 1},
        id="srun-mpi-pmi2",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=0,
            nodeid=1,
            ntasks=2,
            tasks_per_node="1(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="1",
            PMIX_RANK="1",
            PMIX_NAMESPACE="slurm.pmix.4242.0",
        ),
        {"rank": 1, "launcher": "slurm"},
        id="srun-mpi-pmix",
    ),
    pytest.param(
        srun(
            procid=3,
            localid=1,
            nodeid=1,
            ntasks=4,
            tasks_per_node="2(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="2,3",
            PALS_RANKID="3",
            PALS_LOCAL_RANKID="1",
            PALS_NODEID="1",
            PMI_RANK="3",
            PMI_SIZE="4",
            PMI_LOCAL_RANK="1",
            PMI_LOCAL_SIZE="2",
            PALS_APID="4242.0",
        ),
        {"rank": 3, "launcher": "slurm", "node_rank": 1, "local_world_size": 2},
        id="srun-mpi-cray-shasta",
    ),
    # ---- Slurm allocations without srun ------------------------------------------------------
    pytest.param(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "1",
            "SLURM_JOB_NODELIST": "n1",
        },
        {"rank": 0, "world_size": 1, "launcher": "slurm", "job_id": "77"},
        id="sbatch-single-task-batch-step",
    ),
    # ---- torchrun ------------------------------------------------------------------------------
    pytest.param(
        torchrun(2, 4, 2, 4, 0, 1),
        {
            "rank": 2,
            "world_size": 4,
            "local_rank": 2,
            "local_world_size": 4,
            "node_rank": 0,
            "num_nodes": 1,
            "launcher": "torchrun",
            "master_port": 29500,
        },
        id="torchrun-standalone-4",
    ),
    pytest.param(
        torchrun(3, 4, 1, 2, 1, 2, MASTER_ADDR="node0"),
        {"rank": 3, "node_rank": 1, "num_nodes": 2, "master_addr": "node0"},
        id="torchrun-static-2-nodes",
    ),
    pytest.param(
        torchrun(3, 4, 0, 3, 1, 2),
        {"rank": 3, "local_world_size": 3, "node_rank": 1},
        id="torchrun-heterogeneous-nproc",
    ),
    pytest.param(
        {
            **torchrun(2, 4, 0, 2, 1, 2, TORCHELASTIC_RUN_ID="job-17", MASTER_ADDR="localhost"),
            **{
                k: v
                for k, v in srun(
                    procid=0,
                    localid=0,
                    nodeid=0,
                    ntasks=2,
                    tasks_per_node="1(x2)",
                    nodelist="n[1-2]",
                    nnodes=2,
                    gtids="0",
                ).items()
            },
        },
        {"rank": 2, "node_rank": 1, "launcher": "torchrun", "job_id": "job-17", "master_addr": "localhost"},
        id="torchrun-c10d-under-srun-group-rank-differs",
    ),
    pytest.param(
        {**torchrun(1, 2, 1, 2, 0, 1), **ompi(0, 1, 0, 1)},
        {"rank": 1, "launcher": "torchrun"},
        id="torchrun-inside-mpirun",
    ),
    pytest.param(
        torchrun(1, 2, 0, 2, 0, 1, TORCHELASTIC_RESTART_COUNT="3"),
        {"restart_count": 3, "local_rank": 0},
        id="torchrun-virtual-local-rank-restarted",
    ),
    pytest.param(
        torchrun(5, 8, 1, 4, 1, 2, NODE_RANK="0"),
        {"node_rank": 1},
        id="torchrun-stale-NODE_RANK-noted",
    ),
    # ---- Open MPI ------------------------------------------------------------------------------
    pytest.param(
        ompi(2, 4, 2, 4),
        {
            "rank": 2,
            "world_size": 4,
            "local_rank": 2,
            "local_world_size": 4,
            "node_rank": 0,
            "master_addr": "127.0.0.1",
            "launcher": "openmpi",
        },
        id="mpirun-single-node",
    ),
    pytest.param(
        # Was node_rank=1 (the block guess). Without a node count it cannot be told from 1 + 3 + 4 nodes.
        ompi(5, 8, 1, 4),
        {"rank": 5, "local_rank": 1, "node_rank": None, "num_nodes": None, "master_addr": None, "launcher": "openmpi"},
        id="mpirun-2-nodes-no-node-count-no-master",
    ),
    pytest.param(
        ompi(5, 8, 1, 4, OMPI_MCA_orte_num_nodes="2"),
        {"rank": 5, "node_rank": 1, "num_nodes": 2, "master_addr": None, "launcher": "openmpi"},
        id="mpirun-2-nodes-block-rule-with-node-count",
    ),
    pytest.param(
        ompi(5, 8, 2, 4, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_rmaps_base_mapping_policy="node"),
        {"rank": 5, "node_rank": 1, "num_nodes": 2, "launcher": "openmpi"},
        id="mpirun-map-by-node-round-robin-rule",
    ),
    pytest.param(
        ompi(2, 3, 1, 2, OMPI_MCA_orte_num_nodes="2", OMPI_MCA_rmaps_base_mapping_policy="node"),
        {"rank": 2, "node_rank": None, "num_nodes": 2, "launcher": "openmpi"},
        id="mpirun-map-by-node-uneven-unknown",
    ),
    pytest.param(
        ompi(1, 4, 0, 2),
        {"rank": 1, "node_rank": None, "master_addr": None},
        id="mpirun-map-by-node-no-node-rank",
    ),
    pytest.param(
        ompi(5, 8, 1, 4, MASTER_ADDR="n01", MASTER_PORT="29500", NODE_RANK="1"),
        {"node_rank": 1, "master_addr": "n01", "master_port": 29500},
        id="mpirun-x-MASTER_ADDR-and-NODE_RANK",
    ),
    pytest.param(
        ompi(3, 4, 3, 4, OMPI_COMM_WORLD_NODE_RANK="3"),
        {"node_rank": 0, "local_rank": 3},
        id="OMPI_NODE_RANK-is-not-a-node-index",
    ),
    pytest.param(
        {**ompi(3, 4, 1, 2), **ORTED_STEP_NODE1},
        {
            "rank": 3,
            "world_size": 4,
            "local_rank": 1,
            "node_rank": 1,
            "num_nodes": 2,
            "master_addr": "gpu-node01",
            "launcher": "openmpi",
            "job_id": "4242",
        },
        id="mpirun-inside-slurm-daemon-step",
    ),
    pytest.param(
        {**ompi(1, 4, 1, 2), **ALLOC, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"},
        {"rank": 1, "world_size": 4, "master_addr": "gpu-node01", "launcher": "openmpi"},
        id="mpirun-in-sbatch-rank-on-batch-node",
    ),
    pytest.param(
        {**ompi(1, 2, 1, 2), **ALLOC, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"},
        {"rank": 1, "master_addr": "127.0.0.1", "node_rank": 0, "num_nodes": 1, "launcher": "openmpi"},
        id="mpirun-in-sbatch-one-node-world-is-local",
    ),
    # ---- MPICH / Intel MPI hydra ---------------------------------------------------------------
    pytest.param(
        hydra(1, 2, 1, 2),
        {"rank": 1, "world_size": 2, "local_rank": 1, "master_addr": "127.0.0.1", "launcher": "mpich"},
        id="hydra-single-node",
    ),
    pytest.param(
        {**hydra(3, 4, 1, 2), **HYDRA_STEP_NODE1},
        {"rank": 3, "world_size": 4, "node_rank": 1, "launcher": "mpich", "master_addr": "gpu-node01"},
        id="hydra-inside-slurm-stale-ntasks",
    ),
    pytest.param(
        # Was node_rank=1 (the block guess): hydra exports no node count, so the node rank is unknown.
        hydra(2, 4, 0, 2, I_MPI_ROOT="/opt/intel/mpi"),
        {"rank": 2, "launcher": "mpich", "node_rank": None},
        id="intel-mpi-hydra",
    ),
    # ---- other MPI families --------------------------------------------------------------------
    pytest.param(
        {
            "MV2_COMM_WORLD_RANK": "3",
            "MV2_COMM_WORLD_SIZE": "4",
            "MV2_COMM_WORLD_LOCAL_RANK": "1",
            "MV2_COMM_WORLD_LOCAL_SIZE": "2",
        },
        {"rank": 3, "local_rank": 1, "launcher": "mvapich2"},
        id="mvapich2-mpirun-rsh",
    ),
    pytest.param(
        {
            "PALS_RANKID": "5",
            "PALS_LOCAL_RANKID": "1",
            "PALS_NODEID": "1",
            "PMI_RANK": "5",
            "PMI_SIZE": "8",
            "PMI_LOCAL_RANK": "1",
            "PMI_LOCAL_SIZE": "4",
            "PALS_APID": "abc",
            "PBS_JOBID": "123.polaris",
        },
        {
            "rank": 5,
            "world_size": 8,
            "local_world_size": 4,
            "node_rank": 1,
            "launcher": "pals",
            "job_id": "123.polaris",
        },
        id="pals-mpiexec-pbs",
    ),
    pytest.param(
        {
            "JSM_NAMESPACE_RANK": "7",
            "JSM_NAMESPACE_SIZE": "12",
            "JSM_NAMESPACE_LOCAL_RANK": "1",
            "JSM_NAMESPACE_LOCAL_SIZE": "6",
            "LSB_JOBID": "555",
            "LSB_MCPU_HOSTS": "batch1 1 h41n01 42 h41n02 42",
            **ompi(7, 12, 1, 6),
        },
        {"rank": 7, "launcher": "lsf", "master_addr": "h41n01", "num_nodes": 2, "node_rank": 1, "job_id": "555"},
        id="lsf-jsrun",
    ),
    pytest.param(
        {
            "HOROVOD_RANK": "3",
            "HOROVOD_SIZE": "4",
            "HOROVOD_LOCAL_RANK": "1",
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "1",
            "HOROVOD_CROSS_SIZE": "2",
        },
        {"rank": 3, "node_rank": 1, "num_nodes": 2, "launcher": "horovod"},
        id="horovodrun-gloo",
    ),
    pytest.param(
        {
            **ompi(5, 8, 1, 4),
            "AZUREML_RUN_ID": "r1",
            "AZUREML_EXPERIMENT_ID": "e1",
            "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105",
        },
        # Was node_rank=1 (the block guess); Azure's MPI distribution exports no node count either.
        {"rank": 5, "launcher": "azureml", "master_addr": "10.0.0.4", "node_rank": None},
        id="azureml-mpi-distribution-multi-node",
    ),
    pytest.param(
        {**ompi(1, 4, 1, 4), "AZUREML_RUN_ID": "r1", "AZ_BATCHAI_MPI_MASTER_NODE": "10.0.0.4"},
        {"launcher": "azureml", "master_addr": "10.0.0.4"},
        id="azureml-mpi-distribution-single-node",
    ),
    pytest.param(
        {**ompi(9, 16, 1, 8), **SAGEMAKER},
        {"rank": 9, "launcher": "sagemaker", "master_addr": "algo-1", "node_rank": 3, "num_nodes": 4},
        id="sagemaker-mpi",
    ),
    # ---- explicit torch variables --------------------------------------------------------------
    pytest.param(
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
        {"rank": 1, "local_rank": 1, "launcher": "env", "node_rank": None},
        id="plain-exported-torch-vars",
    ),
    pytest.param(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
        {"local_rank": 1, "local_world_size": 2},
        id="exported-vars-loopback-no-local-rank",
    ),
    pytest.param(
        {
            "RANK": "5",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "NODE_RANK": "1",
            "MASTER_ADDR": "10.0.0.4",
            "MASTER_PORT": "6105",
            "AZUREML_RUN_ID": "r",
            "AZUREML_EXPERIMENT_ID": "e",
        },
        {"launcher": "azureml", "node_rank": 1},
        id="azureml-pytorch-distribution",
    ),
    pytest.param(
        {
            "RANK": "5",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "CROSS_RANK": "1",
            "CROSS_SIZE": "2",
            "LOCAL_SIZE": "4",
            "MASTER_ADDR": "w0",
            "MASTER_PORT": "29500",
        },
        {"launcher": "deepspeed", "node_rank": 1, "num_nodes": 2, "local_world_size": 4},
        id="deepspeed-launcher",
    ),
    pytest.param(
        {
            "RANK": "2",
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "PYTHONUNBUFFERED": "1",
        },
        {"rank": 2, "local_rank": 0, "local_world_size": 1, "node_rank": 2, "launcher": "kubeflow"},
        id="kubeflow-legacy-one-process-per-pod",
    ),
    pytest.param(
        {
            "PET_NPROC_PER_NODE": "1",
            "RANK": "1",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "job-master-0",
            "MASTER_PORT": "23456",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        },
        {"rank": 1, "launcher": "kubeflow"},
        id="kubeflow-nproc-1-is-launched",
    ),
    # ---- cloud platforms, one process per host -------------------------------------------------
    pytest.param(
        SAGEMAKER,
        {"rank": 3, "world_size": 4, "node_rank": 3, "master_addr": "algo-1", "launcher": "sagemaker", "local_rank": 0},
        id="sagemaker-lexicographic-hosts",
    ),
    pytest.param(
        {
            "CLUSTER_SPEC": '{"cluster":{"workerpool0":["cmle-training-workerpool0-ab-0:2222"],'
            '"workerpool1":["w1-0:2222","w1-1:2222"]},"task":{"type":"workerpool1","index":1}}'
        },
        {
            "rank": 2,
            "world_size": 3,
            "node_rank": 2,
            "master_addr": "cmle-training-workerpool0-ab-0",
            "master_port": 2222,
            "launcher": "vertex",
        },
        id="vertex-cluster-spec",
    ),
    pytest.param(
        {"AZUREML_RUN_ID": "r1"}, {"rank": 0, "world_size": 1, "launcher": "azureml"}, id="azureml-single-process"
    ),
    # ---- hostile but valid values --------------------------------------------------------------
    pytest.param(
        {"RANK": " 1 ", "WORLD_SIZE": "2\n", "LOCAL_RANK": "1", "MASTER_ADDR": " 127.0.0.1 ", "MASTER_PORT": "29500"},
        {"rank": 1, "world_size": 2, "master_addr": "127.0.0.1"},
        id="surrounding-whitespace-tolerated",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "::1", "MASTER_PORT": "29500"},
        {"master_addr": "::1"},
        id="ipv6-master-addr",
    ),
]

BAD: list[Any] = [
    # ---- not launched --------------------------------------------------------------------------
    pytest.param(
        {**ALLOC, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"},
        NotLaunchedError,
        ("SLURM_STEP_ID", "SLURM_NTASKS"),
        id="sbatch-batch-step-without-srun",
    ),
    pytest.param({**ALLOC, "SLURM_JOB_NAME": "interactive"}, NotLaunchedError, ("SLURM_STEP_ID",), id="salloc-shell"),
    pytest.param(
        {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "1(x2)"},
        NotLaunchedError,
        ("SLURM_TASKS_PER_NODE",),
        id="salloc-N2-without-ntasks",
    ),
    pytest.param(
        {
            "PET_NPROC_PER_NODE": "8",
            "PET_NNODES": "2",
            "PET_NODE_RANK": "1",
            "RANK": "1",
            "WORLD_SIZE": "16",
            "MASTER_ADDR": "m",
            "MASTER_PORT": "1",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        },
        NotLaunchedError,
        ("PET_NPROC_PER_NODE", "RANK"),
        id="kubeflow-prelaunch-nproc-8",
    ),
    pytest.param(
        {"PET_NPROC_PER_NODE": "auto", "RANK": "0", "WORLD_SIZE": "2"},
        NotLaunchedError,
        ("PET_NPROC_PER_NODE",),
        id="kubeflow-prelaunch-nproc-auto",
    ),
    pytest.param(
        {"NPROC_PER_NODE": "8", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "m"},
        NotLaunchedError,
        ("NPROC_PER_NODE",),
        id="pai-dlc-prelaunch",
    ),
    # ---- incomplete ----------------------------------------------------------------------------
    pytest.param(
        {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
        IncompleteEnvError,
        ("RANK",),
        id="torchrun-without-RANK",
    ),
    pytest.param({"PMIX_RANK": "3"}, IncompleteEnvError, ("PMIX_RANK", "WORLD_SIZE"), id="pmix-without-size"),
    pytest.param({"LOCAL_RANK": "1"}, IncompleteEnvError, ("LOCAL_RANK", "RANK"), id="local-rank-only"),
    pytest.param({"RANK": "1"}, IncompleteEnvError, ("WORLD_SIZE",), id="rank-without-world-size"),
    pytest.param({"WORLD_SIZE": "4"}, IncompleteEnvError, ("RANK",), id="world-size-without-rank"),
    pytest.param({"NODE_RANK": "1"}, IncompleteEnvError, ("NODE_RANK",), id="node-rank-only"),
    pytest.param(
        {"JSM_NAMESPACE_SIZE": "4", "LSB_JOBID": "5"},
        IncompleteEnvError,
        ("JSM_NAMESPACE_RANK",),
        id="jsm-without-rank",
    ),
    pytest.param(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"},
        IncompleteEnvError,
        ("LOCAL_RANK",),
        id="multi-host-without-local-rank",
    ),
    pytest.param(
        {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0"},
        IncompleteEnvError,
        ("SLURM_JOB_ID",),
        id="slurm-step-without-job-id",
    ),
    # ---- conflicting ---------------------------------------------------------------------------
    pytest.param(
        {**ompi(5, 8, 1, 4), "RANK": "3"},
        ConflictingEnvError,
        ("RANK", "OMPI_COMM_WORLD_RANK"),
        id="exported-RANK-under-mpirun",
    ),
    pytest.param(
        {**ompi(5, 8, 1, 4), "WORLD_SIZE": "4"},
        ConflictingEnvError,
        ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
        id="exported-WORLD_SIZE-under-mpirun",
    ),
    pytest.param(
        srun(
            procid=5,
            localid=1,
            nodeid=1,
            ntasks=8,
            tasks_per_node="4(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="4,5,6,7",
            NODE_RANK="0",
        ),
        ConflictingEnvError,
        ("NODE_RANK", "SLURM_NODEID"),
        id="exported-NODE_RANK-vs-SLURM_NODEID",
    ),
    pytest.param(
        srun(
            procid=5,
            localid=1,
            nodeid=1,
            ntasks=8,
            tasks_per_node="4(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="4,5,6,7",
            RANK="1",
            WORLD_SIZE="8",
        ),
        ConflictingEnvError,
        ("RANK", "SLURM_PROCID"),
        id="exported-RANK-vs-SLURM_PROCID",
    ),
    pytest.param(
        {**ompi(1, 4, 1, 2), **hydra(2, 4, 0, 2)},
        ConflictingEnvError,
        ("OMPI_COMM_WORLD_RANK", "PMI_RANK"),
        id="two-mpi-families-disagree",
    ),
    pytest.param(
        {"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h"},
        ConflictingEnvError,
        ("RANK", "WORLD_SIZE"),
        id="rank-not-below-world",
    ),
    pytest.param(
        torchrun(1, 2, 2, 2, 0, 1),
        ConflictingEnvError,
        ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        id="torchrun-local-rank-too-big",
    ),
    pytest.param(
        ompi(1, 2, 0, 4),
        ConflictingEnvError,
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"),
        id="local-size-exceeds-world",
    ),
    pytest.param(
        srun(procid=1, localid=0, nodeid=3, ntasks=2, tasks_per_node="1(x2)", nodelist="h[1-2]", nnodes=2, gtids="1"),
        ConflictingEnvError,
        ("SLURM_NODEID",),
        id="lightning-fixture-impossible-nodeid",
    ),
    pytest.param(
        srun(procid=1, localid=2, nodeid=0, ntasks=2, tasks_per_node="2", nodelist="h1", nnodes=1, gtids="0,1"),
        ConflictingEnvError,
        ("SLURM_LOCALID", "SLURM_GTIDS"),
        id="localid-not-position-in-gtids",
    ),
    pytest.param(
        srun(
            procid=5,
            localid=0,
            nodeid=0,
            ntasks=8,
            tasks_per_node="4(x2)",
            nodelist="h[1-2]",
            nnodes=2,
            gtids="0,1,2,3",
        ),
        ConflictingEnvError,
        ("SLURM_PROCID", "SLURM_GTIDS"),
        id="procid-not-in-gtids",
    ),
    pytest.param(
        srun(procid=1, localid=1, nodeid=0, ntasks=5, tasks_per_node="2(x2)", nodelist="h[1-2]", nnodes=2, gtids="0,1"),
        ConflictingEnvError,
        ("SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS"),
        id="tasks-per-node-sum-mismatch",
    ),
    pytest.param(
        srun(procid=1, localid=1, nodeid=0, ntasks=4, tasks_per_node="2(x2)", nodelist="h[1-3]", nnodes=2, gtids="0,1"),
        ConflictingEnvError,
        ("SLURM_STEP_NODELIST",),
        id="nodelist-length-mismatch",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=1,
            nodeid=0,
            ntasks=4,
            tasks_per_node="2(x2)",
            nodelist="h[1-2]",
            nnodes=2,
            gtids="0,1",
            nodename="h2",
        ),
        ConflictingEnvError,
        ("SLURMD_NODENAME", "SLURM_NODEID"),
        id="slurmd-nodename-at-other-index",
    ),
    pytest.param(
        srun(
            procid=1,
            localid=0,
            nodeid=1,
            ntasks=2,
            tasks_per_node="1(x2)",
            nodelist="n[1-2]",
            nnodes=2,
            gtids="1",
            PMI_RANK="0",
            PMI_SIZE="2",
        ),
        ConflictingEnvError,
        ("PMI_RANK", "SLURM_PROCID"),
        id="srun-pmi2-rank-disagrees",
    ),
    pytest.param(
        {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-3"},
        ConflictingEnvError,
        ("SM_CURRENT_HOST",),
        id="sagemaker-current-not-in-hosts",
    ),
    # ---- malformed -----------------------------------------------------------------------------
    pytest.param({"RANK": "one", "WORLD_SIZE": "2"}, MalformedEnvError, ("RANK",), id="rank-not-integer"),
    pytest.param({"RANK": "", "WORLD_SIZE": "2"}, MalformedEnvError, ("RANK",), id="rank-empty-string"),
    pytest.param(
        {"RANK": "1_0", "WORLD_SIZE": "20"}, MalformedEnvError, ("RANK",), id="rank-python-underscore-literal"
    ),
    pytest.param({"RANK": "-1", "WORLD_SIZE": "2"}, MalformedEnvError, ("RANK",), id="rank-negative"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "0"}, MalformedEnvError, ("WORLD_SIZE",), id="world-size-zero"),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "99999999999999999999"}, MalformedEnvError, ("WORLD_SIZE",), id="world-size-huge"
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"},
        MalformedEnvError,
        ("MASTER_PORT",),
        id="port-out-of-range",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "http"},
        MalformedEnvError,
        ("MASTER_PORT",),
        id="port-not-integer",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1:29500"},
        MalformedEnvError,
        ("MASTER_ADDR", "MASTER_PORT"),
        id="master-addr-with-port",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "tcp://h"},
        MalformedEnvError,
        ("MASTER_ADDR",),
        id="master-addr-with-scheme",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "   "},
        MalformedEnvError,
        ("MASTER_ADDR",),
        id="master-addr-blank",
    ),
    pytest.param(
        srun(procid=0, localid=0, nodeid=0, ntasks=2, tasks_per_node="2", nodelist="n[3-1]", nnodes=1, gtids="0,1"),
        MalformedEnvError,
        ("SLURM_STEP_NODELIST",),
        id="nodelist-backwards-range",
    ),
    pytest.param(
        srun(procid=0, localid=0, nodeid=0, ntasks=2, tasks_per_node="2x", nodelist="n1", nnodes=1, gtids="0,1"),
        MalformedEnvError,
        ("SLURM_STEP_TASKS_PER_NODE",),
        id="tasks-per-node-garbage",
    ),
    pytest.param(
        srun(procid=0, localid=0, nodeid=0, ntasks=2, tasks_per_node="2", nodelist="n1", nnodes=1, gtids="0;1"),
        MalformedEnvError,
        ("SLURM_GTIDS",),
        id="gtids-garbage",
    ),
    pytest.param(
        {"SM_HOSTS": "algo-1,algo-2", "SM_CURRENT_HOST": "algo-1"},
        MalformedEnvError,
        ("SM_HOSTS",),
        id="sagemaker-hosts-not-json",
    ),
    pytest.param(
        {"CLUSTER_SPEC": '{"cluster": {}}'}, MalformedEnvError, ("CLUSTER_SPEC",), id="vertex-spec-without-pools"
    ),
    pytest.param(
        {"CLUSTER_SPEC": '{"cluster":{"workerpool0":["a:1"]},"task":{"type":"workerpool2","index":0}}'},
        MalformedEnvError,
        ("CLUSTER_SPEC",),
        id="vertex-reduction-server-not-in-world",
    ),
    pytest.param(
        {
            **ompi(7, 12, 1, 6),
            "JSM_NAMESPACE_RANK": "7",
            "JSM_NAMESPACE_SIZE": "12",
            "LSB_JOBID": "5",
            "LSB_MCPU_HOSTS": "batch1 1 h1",
        },
        MalformedEnvError,
        ("LSB_MCPU_HOSTS",),
        id="lsf-mcpu-hosts-odd",
    ),
]
