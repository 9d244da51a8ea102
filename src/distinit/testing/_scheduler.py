"""``scheduler_env``: the variables a real launcher gives one process of a given layout.

Each preset reproduces what the launcher itself exports (checked against real captures of Slurm 22.05,
Open MPI 4.1, MPICH 4.0 hydra and torchrun 2.13 in ``tests/integration/launchers/captures``; LSF
``jsrun``, HPE PALS, Kubeflow and SageMaker follow their documentation, see
``docs/testing.md``). Values that depend on the site (job ids, ports, paths, user ids) are
plausible constants; values that depend on the layout (ranks, sizes, node lists, tasks-per-node
strings) are computed exactly as the launcher computes them.

Pure: no I/O unless ``files_dir`` is given (then node files for PALS and LSF are written there).

Writes launcher variables itself: building what a launcher exports, for tests of the code that reads it, is
this module's purpose.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["LAUNCHERS", "LAUNCHER_PREFIXES", "PresetLauncher", "compress_hostlist", "scheduler_env"]

PresetLauncher = Literal["slurm", "openmpi", "mpich", "torchrun", "lsf", "pals", "kubeflow", "sagemaker"]

#: Variable name prefixes and names a launcher may set; the ``scheduler_env`` fixture clears them first.
LAUNCHER_PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_LOCAL",
    "HYDRA_",
    "PALS_",
    "PBS_",
    "LSB_",
    "LSF_",
    "JSM_",
    "TORCHELASTIC_",
    "ROLE_",
    "PET_",
    "SM_",
    "MV2_",
    "FLUX_",
    "HOROVOD_",
)
LAUNCHER_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
)


@dataclass(frozen=True)
class _Layout:
    """Where every rank runs: ``hosts[n]`` holds ``ranks_on[n]`` (global ranks, in local-rank order)."""

    hosts: tuple[str, ...]
    ranks_on: tuple[tuple[int, ...], ...]
    rank: int

    @property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.ranks_on)

    @property
    def node(self) -> int:
        return next(n for n, ranks in enumerate(self.ranks_on) if self.rank in ranks)

    @property
    def local_rank(self) -> int:
        return self.ranks_on[self.node].index(self.rank)

    @property
    def local_size(self) -> int:
        return len(self.ranks_on[self.node])

    @property
    def counts(self) -> list[int]:
        return [len(ranks) for ranks in self.ranks_on]


def _layout(
    nodes: int, tasks_per_node: int | Sequence[int], rank: int, hostnames: Sequence[str] | None, distribution: str
) -> _Layout:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be an integer >= 1, got {nodes!r}")
    if isinstance(tasks_per_node, int):
        counts = [tasks_per_node] * nodes
    elif isinstance(tasks_per_node, (str, bytes)):
        raise ValueError(f"tasks_per_node must be integers >= 1, got {tasks_per_node!r}")
    else:
        counts = list(tasks_per_node)
        if len(counts) != nodes:
            raise ValueError(f"tasks_per_node lists {len(counts)} nodes but nodes={nodes}: give one count per node")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
        raise ValueError(f"tasks_per_node must be integers >= 1, got {tasks_per_node!r}")
    world_size = sum(counts)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(
            f"rank={rank!r} is outside the world of {world_size} ranks (nodes={nodes}, tasks_per_node={counts})"
        )
    hosts = tuple(hostnames) if hostnames is not None else tuple(f"node{n + 1}" for n in range(nodes))
    if len(hosts) != nodes or not all(isinstance(h, str) and h for h in hosts):
        raise ValueError(f"hostnames must give {nodes} non-empty names, got {hostnames!r}")
    placed: list[list[int]] = [[] for _ in range(nodes)]
    if distribution == "block":
        start = 0
        for n, count in enumerate(counts):
            placed[n] = list(range(start, start + count))
            start += count
    elif distribution == "cyclic":
        next_rank = 0
        while next_rank < world_size:
            for n in range(nodes):
                if len(placed[n]) < counts[n] and next_rank < world_size:
                    placed[n].append(next_rank)
                    next_rank += 1
    else:
        raise ValueError(f"distribution must be 'block' or 'cyclic', got {distribution!r}")
    return _Layout(hosts, tuple(tuple(p) for p in placed), rank)


def compress_counts(counts: Sequence[int]) -> str:
    """Slurm's tasks-per-node grammar: ``[2, 2, 1]`` -> ``"2(x2),1"``."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        repeat = j - i + 1
        parts.append(f"{counts[i]}(x{repeat})" if repeat > 1 else str(counts[i]))
        i = j + 1
    return ",".join(parts)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(hosts: Sequence[str]) -> str:
    """Slurm's hostlist form: ``["dnode1", "dnode2", "dnode3"]`` -> ``"dnode[1-3]"`` (order kept)."""
    groups: list[tuple[str, int, list[int]]] = []  # prefix, width, numbers
    out: list[str] = []

    def flush() -> None:
        for prefix, width, numbers in groups:
            if len(numbers) == 1:
                out.append(f"{prefix}{numbers[0]:0{width}d}")
                continue
            ranges: list[str] = []
            start = prev = numbers[0]
            for number in [*numbers[1:], None]:
                if number is not None and number == prev + 1:
                    prev = number
                    continue
                ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
                if number is not None:
                    start = prev = number
            out.append(f"{prefix}[{','.join(ranges)}]")
        groups.clear()

    for host in hosts:
        match = _NUMBERED.match(host)
        if match is None:
            flush()
            out.append(host)
            continue
        prefix, digits = match.group(1), match.group(2)
        width = len(digits) if digits.startswith("0") else 1
        if groups and groups[-1][0] == prefix and groups[-1][1] == width and int(digits) > groups[-1][2][-1]:
            groups[-1][2].append(int(digits))
        else:
            flush()
            groups.append((prefix, width, [int(digits)]))
    flush()
    return ",".join(out)


def _slurm(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    job, step = str(o["job_id"]), str(o["step_id"])
    host = lay.hosts[lay.node]
    nodelist = compress_hostlist(lay.hosts)
    counts = compress_counts(lay.counts)
    env = {
        "SLURMD_NODENAME": host,
        "SLURM_CLUSTER_NAME": o["cluster"],
        "SLURM_CPUS_ON_NODE": str(lay.local_size * o["cpus_per_task"]),
        "SLURM_GTIDS": ",".join(map(str, lay.ranks_on[lay.node])),
        "SLURM_JOBID": job,
        "SLURM_JOB_ID": job,
        "SLURM_JOB_CPUS_PER_NODE": compress_counts([c * o["cpus_per_task"] for c in lay.counts]),
        "SLURM_JOB_GID": "1000",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_USER": "user",
        "SLURM_JOB_NAME": o["job_name"],
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(lay.hosts)),
        "SLURM_JOB_PARTITION": o["partition"],
        "SLURM_LAUNCH_NODE_IPADDR": o["launch_addr"],
        "SLURM_LOCALID": str(lay.local_rank),
        "SLURM_NNODES": str(len(lay.hosts)),
        "SLURM_NODEID": str(lay.node),
        "SLURM_NODELIST": nodelist,
        "SLURM_NPROCS": str(lay.world_size),
        "SLURM_NTASKS": str(lay.world_size),
        "SLURM_PRIO_PROCESS": "0",
        "SLURM_PROCID": str(lay.rank),
        "SLURM_SRUN_COMM_HOST": o["launch_addr"],
        "SLURM_SRUN_COMM_PORT": "41000",
        "SLURM_STEPID": step,
        "SLURM_STEP_ID": step,
        "SLURM_STEP_LAUNCHER_PORT": "41000",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(len(lay.hosts)),
        "SLURM_STEP_NUM_TASKS": str(lay.world_size),
        "SLURM_STEP_TASKS_PER_NODE": counts,
        "SLURM_SUBMIT_DIR": "/home/user",
        "SLURM_SUBMIT_HOST": "login1",
        "SLURM_TASKS_PER_NODE": counts,
        "SLURM_TASK_PID": str(20000 + lay.rank),
        "SLURM_TOPOLOGY_ADDR": host,
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_UMASK": "0022",
        "SLURM_WORKING_CLUSTER": f"{o['cluster']}:slurmctld:6817:9728:109",
    }
    if o["ntasks_per_node_flag"]:
        # Only set when --ntasks-per-node was given (sbatch(1)); absent with -n or uneven layouts.
        env["SLURM_NTASKS_PER_NODE"] = str(lay.counts[0])
    if o["distribution"] != "block":
        env["SLURM_DISTRIBUTION"] = o["distribution"]
    env.update(_slurm_mpi(lay, o["mpi"], job=job, step=step, host=host))
    if o["mpi"] == "pmix":
        del env["PMIX_ID"]
    return env


def _slurm_mpi(lay: _Layout, mpi: str | None, *, job: str, step: str, host: str) -> dict[str, str]:
    """What ``srun --mpi=MPI`` adds to a task's environment (nothing without ``--mpi``)."""
    if mpi == "pmi2":
        return {
            "SLURM_MPI_TYPE": "pmi2",
            "PMI_FD": "13",
            "PMI_JOBID": f"{job}.{step}",
            "PMI_RANK": str(lay.rank),
            "PMI_SIZE": str(lay.world_size),
        }
    if mpi == "pmix":
        server = f"pmix-server.{30000 + lay.node};tcp4://127.0.0.1:35623"
        spool = f"/var/spool/slurmd/{host}/pmix.{job}.{step}/"
        return {
            "SLURM_MPI_TYPE": "pmix",
            "SLURM_PMIXP_ABORT_AGENT_PORT": "36839",
            "SLURM_PMIX_MAPPING_SERV": f"(vector,{_pmix_mapping(lay.counts)})",
            **_pmix_common(lay, namespace=f"slurm.pmix.{job}.{step}", server=server, tmpdir=spool),
        }
    if mpi is not None:
        raise ValueError(f"mpi must be None, 'pmi2' or 'pmix', got {mpi!r}")
    return {}


def _pmix_mapping(counts: Sequence[int]) -> str:
    """Slurm's ``SLURM_PMIX_MAPPING_SERV`` blocks: ``(first node, node count, tasks per node)``."""
    blocks: list[str] = []
    start = 0
    while start < len(counts):
        end = start
        while end + 1 < len(counts) and counts[end + 1] == counts[start]:
            end += 1
        blocks.append(f"({start},{end - start + 1},{counts[start]})")
        start = end + 1
    return ",".join(blocks)


def _pmix_common(lay: _Layout, *, namespace: str, server: str, tmpdir: str) -> dict[str, str]:
    return {
        "PMIX_BFROP_BUFFER_TYPE": "PMIX_BFROP_BUFFER_NON_DESC",
        "PMIX_DSTORE_21_BASE_PATH": f"{tmpdir}/pmix_dstor_ds21_{30000 + lay.node}",
        "PMIX_DSTORE_ESH_BASE_PATH": f"{tmpdir}/pmix_dstor_ds12_{30000 + lay.node}",
        "PMIX_GDS_MODULE": "ds21,ds12,hash",
        "PMIX_HOSTNAME": lay.hosts[lay.node],
        "PMIX_ID": f"{namespace}.{lay.rank}",
        "PMIX_NAMESPACE": namespace,
        "PMIX_RANK": str(lay.rank),
        "PMIX_SECURITY_MODE": "munge,native",
        "PMIX_SERVER_TMPDIR": tmpdir,
        "PMIX_SERVER_URI2": server,
        "PMIX_SERVER_URI21": server,
        "PMIX_SERVER_URI3": server,
        "PMIX_SERVER_URI4": server,
        "PMIX_SERVER_URI41": server,
        "PMIX_SYSTEM_TMPDIR": "/tmp",
        "PMIX_VERSION": "4.2.2",
    }


def _openmpi(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    jobid = 1580204033
    session = f"/tmp/ompi.{lay.hosts[0]}.1000/jf.24112"
    hnp = f"{jobid - 1}.0;tcp://10.0.0.1:53949"
    daemon = f"{jobid - 1}.{lay.node};tcp://10.0.0.{lay.node + 1}:32805"
    multi = len(lay.hosts) > 1
    env = {
        "OMPI_APP_CTX_NUM_PROCS": str(lay.world_size),
        "OMPI_ARGV": o["argv"],
        "OMPI_COMMAND": o["command"],
        # OMPI_COMM_WORLD_NODE_RANK is a local rank across jobs, not a node index (it equals the
        # local rank in every capture); Open MPI exports no node index at all.
        "OMPI_COMM_WORLD_LOCAL_RANK": str(lay.local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(lay.local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(lay.local_rank),
        "OMPI_COMM_WORLD_RANK": str(lay.rank),
        "OMPI_COMM_WORLD_SIZE": str(lay.world_size),
        "OMPI_FILE_LOCATION": f"{session}/0/{lay.rank}",
        "OMPI_FIRST_RANKS": "0",
        "OMPI_MCA_ess": "^singleton",
        "OMPI_MCA_ess_base_jobid": str(jobid),
        "OMPI_MCA_ess_base_vpid": str(lay.rank),
        "OMPI_MCA_initial_wdir": "/home/user",
        "OMPI_MCA_mpi_oversubscribe": "0",
        "OMPI_MCA_orte_app_num": "0",
        "OMPI_MCA_orte_ess_node_rank": str(lay.local_rank),
        "OMPI_MCA_orte_ess_num_procs": str(lay.world_size),
        "OMPI_MCA_orte_hnp_uri": hnp,
        "OMPI_MCA_orte_jobfam_session_dir": session,
        "OMPI_MCA_orte_launch": "1",
        "OMPI_MCA_orte_local_daemon_uri": daemon if multi else hnp,
        "OMPI_MCA_orte_num_nodes": str(len(lay.hosts)),
        "OMPI_MCA_orte_precondition_transports": "4e05c1bc4c5edf82-d35d1dcaedba2a77",
        "OMPI_MCA_orte_tmpdir_base": "/tmp",
        "OMPI_MCA_orte_top_session_dir": f"/tmp/ompi.{lay.hosts[0]}.1000",
        "OMPI_MCA_pmix": "^s1,s2,cray,isolated",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "OMPI_MCA_shmem_RUNTIME_QUERY_hint": "mmap",
        "OMPI_NUM_APP_CTX": "1",
        "OMPI_UNIVERSE_SIZE": str(lay.world_size),
        "PMIX_MCA_mca_base_component_show_load_errors": "1",
        **_pmix_common(
            lay, namespace=str(jobid), server=f"{jobid - 1}.{lay.node};tcp4://127.0.0.1:51853", tmpdir=session
        ),
    }
    if o["distribution"] == "cyclic":
        env["OMPI_MCA_rmaps_base_mapping_policy"] = "node"  # mpirun --map-by node
    if multi:
        env.update(
            {
                "OMPI_MCA_ess_base_num_procs": str(len(lay.hosts) + 1),
                "OMPI_MCA_orte_bound_at_launch": "1",
                "OMPI_MCA_orte_node_regex": f"{lay.hosts[0]}-launcher,{','.join(lay.hosts)}@0({len(lay.hosts) + 1})",
                "OMPI_MCA_orte_parent_uri": hnp,
                "OMPI_MCA_plm": "rsh",
                "OMPI_MCA_routed": "radix",
            }
        )
    return env


def _mpich(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    del o
    return {
        "MPI_LOCALNRANKS": str(lay.local_size),
        "MPI_LOCALRANKID": str(lay.local_rank),
        "PMI_FD": "7",
        "PMI_RANK": str(lay.rank),
        "PMI_SIZE": str(lay.world_size),
    }


def _torchrun(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    rdzv = o["rdzv"]
    if rdzv not in ("c10d", "static", "standalone"):
        raise ValueError(f"rdzv must be 'c10d', 'static' or 'standalone', got {rdzv!r}")
    run_id = o["run_id"] or ("none" if rdzv == "static" else "5c6a0f1e-0d7b-4c43-9f58-6d3a2e1b7c90")
    # --master-addr with static rendezvous (default 127.0.0.1); the store host's name with c10d.
    default_addr = "127.0.0.1" if rdzv == "static" else "localhost"
    return {
        "GROUP_RANK": str(lay.node),
        "GROUP_WORLD_SIZE": str(len(lay.hosts)),
        "LOCAL_RANK": str(lay.local_rank),
        "LOCAL_WORLD_SIZE": str(lay.local_size),
        "MASTER_ADDR": o["master_addr"] or default_addr,
        "MASTER_PORT": str(o["master_port"]),
        "RANK": str(lay.rank),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(lay.rank),
        "ROLE_WORLD_SIZE": str(lay.world_size),
        "TORCHELASTIC_ERROR_FILE": f"/tmp/torchelastic_x/{run_id}_y/attempt_0/{lay.local_rank}/error.json",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "WORLD_SIZE": str(lay.world_size),
    }


def _write(files_dir: str | None, name: str, lines: Sequence[str], default: str) -> str:
    if files_dir is None:
        return default
    path = os.path.join(files_dir, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in lines))
    return path


def _lsf(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    job = str(o["job_id"])
    launch = o["launch_host"]
    # LSF lists the launch (batch) node first, with one slot, then the compute hosts.
    slots = [launch] + [host for host, count in zip(lay.hosts, lay.counts, strict=True) for _ in range(count)]
    mcpu = " ".join([launch, "1"] + [f"{h} {c}" for h, c in zip(lay.hosts, lay.counts, strict=True)])
    hostfile = _write(o["files_dir"], f"lsf-{job}.hostfile", slots, f"/home/user/.lsbatch/{job}.hostfile")
    rankfile = _write(
        o["files_dir"], f"lsf-{job}.rankfile", [launch, *lay.hosts], f"/home/user/.lsbatch/{job}.rankfile"
    )
    env = {
        "LSB_JOBID": job,
        "LSB_JOBNAME": o["job_name"],
        "LSB_DJOB_HOSTFILE": hostfile,
        "LSB_DJOB_RANKFILE": rankfile,
        "LSB_MCPU_HOSTS": mcpu,
        "LSB_HOSTS": " ".join(slots),
        "LSF_VERSION": "10.1",
        "JSM_NAMESPACE_RANK": str(lay.rank),
        "JSM_NAMESPACE_LOCAL_RANK": str(lay.local_rank),
        "JSM_NAMESPACE_SIZE": str(lay.world_size),
        "JSM_NAMESPACE_LOCAL_SIZE": str(lay.local_size),
        # jsrun starts Spectrum MPI tasks, which also carry the Open MPI world variables.
        "OMPI_COMM_WORLD_RANK": str(lay.rank),
        "OMPI_COMM_WORLD_SIZE": str(lay.world_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(lay.local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(lay.local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(lay.local_rank),
        "PMIX_RANK": str(lay.rank),
        "PMIX_NAMESPACE": f"jsm.{job}.0",
    }
    return env


def _pals(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    job = str(o["job_id"])
    nodefile = _write(o["files_dir"], f"pbs-{job}.nodefile", lay.hosts, f"/var/spool/pbs/aux/{job}.pbs01")
    return {
        "PALS_APID": f"{job}.0",
        "PALS_RANKID": str(lay.rank),
        "PALS_LOCAL_RANKID": str(lay.local_rank),
        "PALS_NODEID": str(lay.node),
        "PALS_DEPTH": "1",
        "PMI_RANK": str(lay.rank),
        "PMI_LOCAL_RANK": str(lay.local_rank),
        "PMI_SIZE": str(lay.world_size),
        "PMI_LOCAL_SIZE": str(lay.local_size),
        "PMI_UNIVERSE_SIZE": str(lay.world_size),
        "PMI_JOBID": f"{job}.0",
        "PBS_JOBID": f"{job}.pbs01",
        "PBS_NODEFILE": nodefile,
        "PBS_O_WORKDIR": "/home/user",
    }


def _kubeflow(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    job = o["job_name"]
    pod = f"{job}-master-0" if lay.node == 0 else f"{job}-worker-{lay.node - 1}"
    env = {
        "MASTER_ADDR": o["master_addr"] or f"{job}-master-0",
        "MASTER_PORT": str(o["master_port"]),
        "PYTHONUNBUFFERED": "1",
        "HOSTNAME": pod,
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    nproc = o["nproc_per_node"]
    if nproc is None:
        # Legacy operator: one process per pod; RANK is the replica index (master 0, workers +1).
        if lay.counts != [1] * len(lay.hosts):
            raise ValueError("kubeflow without nproc_per_node runs one process per pod: use tasks_per_node=1")
        env.update({"RANK": str(lay.node), "WORLD_SIZE": str(len(lay.hosts))})
    else:
        # With nprocPerNode the pod env is pre-launch (node level); torchrun reads the PET_* variables.
        env.update(
            {
                "RANK": str(lay.node),
                "WORLD_SIZE": str(len(lay.hosts) * nproc),
                "PET_NNODES": str(len(lay.hosts)),
                "PET_NODE_RANK": str(lay.node),
                "PET_NPROC_PER_NODE": str(nproc),
                "PET_MASTER_ADDR": env["MASTER_ADDR"],
                "PET_MASTER_PORT": env["MASTER_PORT"],
            }
        )
    return env


def _sagemaker(lay: _Layout, o: dict[str, Any]) -> dict[str, str]:
    if lay.counts != [1] * len(lay.hosts):
        raise ValueError("sagemaker runs the entry point once per host: use tasks_per_node=1")
    hosts = sorted(f"algo-{n + 1}" for n in range(len(lay.hosts)))  # SageMaker sorts lexicographically
    current = hosts[lay.node]
    training_env = {
        "current_host": current,
        "hosts": hosts,
        "num_gpus": o["num_gpus"],
        "num_cpus": o["num_cpus"],
        "network_interface_name": "eth0",
        "module_dir": "/opt/ml/code",
        "model_dir": "/opt/ml/model",
    }
    return {
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": current,
        "SM_NUM_GPUS": str(o["num_gpus"]),
        "SM_NUM_CPUS": str(o["num_cpus"]),
        "SM_NETWORK_INTERFACE_NAME": "eth0",
        "SM_MODEL_DIR": "/opt/ml/model",
        "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data",
        "SM_CHANNELS": "[]",
        "SM_TRAINING_ENV": json.dumps(training_env),
        "SM_USER_ENTRY_POINT": "train.py",
    }


_BUILDERS: dict[str, tuple[Callable[[_Layout, dict[str, Any]], dict[str, str]], dict[str, Any]]] = {
    "slurm": (
        _slurm,
        {
            "job_id": 4242,
            "step_id": 0,
            "job_name": "job",
            "partition": "batch",
            "cluster": "cluster",
            "launch_addr": "10.0.0.1",
            "cpus_per_task": 1,
            "ntasks_per_node_flag": False,
            "mpi": None,
        },
    ),
    "openmpi": (_openmpi, {"argv": "train.py", "command": "python"}),
    "mpich": (_mpich, {}),
    "torchrun": (_torchrun, {"rdzv": "c10d", "run_id": None, "master_addr": None, "master_port": 29500}),
    "lsf": (_lsf, {"job_id": 4242, "job_name": "job", "launch_host": "batch1", "files_dir": None}),
    "pals": (_pals, {"job_id": 4242, "files_dir": None}),
    "kubeflow": (
        _kubeflow,
        {"job_name": "pytorchjob", "master_addr": None, "master_port": 23456, "nproc_per_node": None},
    ),
    "sagemaker": (_sagemaker, {"num_gpus": 0, "num_cpus": 8}),
}

#: The launchers ``scheduler_env`` has presets for.
LAUNCHERS: tuple[str, ...] = tuple(_BUILDERS)


def scheduler_env(
    launcher: PresetLauncher,
    *,
    nodes: int = 1,
    tasks_per_node: int | Sequence[int] = 1,
    rank: int = 0,
    hostnames: Sequence[str] | None = None,
    distribution: Literal["block", "cyclic"] = "block",
    **options: Any,
) -> dict[str, str]:
    """The variables ``launcher`` exports to the process of global ``rank`` in the given layout.

    Args:
        launcher: one of ``slurm`` (an ``srun`` step), ``openmpi`` (``mpirun``), ``mpich`` (hydra
            ``mpiexec``), ``torchrun``, ``lsf`` (``jsrun``), ``pals`` (HPE Cray PALS ``mpiexec``),
            ``kubeflow`` (PyTorchJob pod) or ``sagemaker`` (one process per host).
        nodes: number of nodes (hosts, agents, pods).
        tasks_per_node: processes per node: one count for all, or a list with one count per node.
        rank: global rank of the process whose environment is wanted.
        hostnames: node names (default ``node1``, ``node2``, ...).
        distribution: ``block`` fills node 0 first; ``cyclic`` deals ranks round-robin
            (``srun --distribution=cyclic``, ``mpirun --map-by node``, hydra without ``-ppn``).
        **options: launcher-specific settings. slurm: ``job_id``, ``step_id``, ``job_name``,
            ``partition``, ``cluster``, ``launch_addr``, ``cpus_per_task``, ``ntasks_per_node_flag``
            (``--ntasks-per-node`` was given), ``mpi`` (``None``, ``"pmi2"``, ``"pmix"``). torchrun:
            ``rdzv`` (``c10d``, ``static``, ``standalone``), ``run_id``, ``master_addr``,
            ``master_port``. lsf: ``job_id``, ``job_name``, ``launch_host``, ``files_dir``. pals:
            ``job_id``, ``files_dir``. kubeflow: ``job_name``, ``master_addr``, ``master_port``,
            ``nproc_per_node``. sagemaker: ``num_gpus``, ``num_cpus``. openmpi: ``argv``, ``command``.
            ``files_dir`` makes lsf/pals write their host files there (otherwise the paths are
            the launcher's usual ones and do not exist).

    Returns:
        Variable name -> value, only the launcher's own variables.

    Raises:
        ValueError: unknown launcher, unknown option, or a layout that does not hold ``rank``.
    """
    if launcher not in _BUILDERS:
        raise ValueError(f"no scheduler_env preset for launcher {launcher!r}; presets: {', '.join(LAUNCHERS)}")
    build, defaults = _BUILDERS[launcher]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(
            f"scheduler_env({launcher!r}) got unknown option(s) {unknown}; "
            f"{launcher} takes: {', '.join(sorted(defaults)) or 'no options'}"
        )
    settings = {**defaults, **options}
    settings["distribution"] = distribution
    layout = _layout(nodes, tasks_per_node, rank, hostnames, distribution)
    return build(layout, settings)
