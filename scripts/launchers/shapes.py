"""Launch shapes: how each real launcher is started in distinit's launcher tests and captures.

A ``Shape`` turns "run COMMAND in every task" into one or more real launcher command lines
(``srun``, ``sbatch --wait``, ``salloc``, ``mpirun.openmpi``, ``mpiexec.hydra``, ``torchrun``), and
says what the launched world must look like: the emulated nodes in node-rank order, the key of the
ground truth that names a task's node (see ``task.py``), how strictly ``node_rank`` is checked and
the exit status expected. Every task runs through ``task.py``, which records its environment.

``run_shape`` starts the launches together (torchrun's multi-node shapes need two agents at once),
waits under a timeout, kills the launchers' process groups when it expires, and returns one record
per task. Used by ``tests/integration/launchers`` and by ``capture.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import Cluster  # noqa: E402
from task import is_launcher_variable  # noqa: E402

TASK_PY = HERE / "task.py"
FAKE_RSH = HERE / "fake_rsh"
ORTED_ISOLATED = HERE / "orted_isolated"

OPENMPI = "mpirun.openmpi"
HYDRA = "mpiexec.hydra"
# Open MPI as root: the flag rather than OMPI_ALLOW_RUN_AS_ROOT*, which would show in every capture.
OPENMPI_BASE = [OPENMPI, "--allow-run-as-root", "--oversubscribe", "--mca", "orte_launch_agent", str(ORTED_ISOLATED)]
OPENMPI_FAKE_NODES = ["--mca", "plm_rsh_agent", str(FAKE_RSH)]
SLURM_TIME = ["-t", "2", "-J", "distinit-test"]


class LaunchError(RuntimeError):
    """A launch timed out, failed, or did not produce one record per task."""


@dataclass(frozen=True)
class Launch:
    """One launcher process to start: its argv and environment."""

    argv: list[str]
    env: dict[str, str]


@dataclass
class Context:
    """What a shape needs to build its launches."""

    python: str
    outdir: Path
    cluster: Cluster | None = None
    with_master: bool = True
    ports: list[int] = field(default_factory=list)

    def task(self, command: Sequence[str]) -> list[str]:
        """Argv that runs COMMAND inside one launched task, recording its environment."""
        return [self.python, str(TASK_PY), str(self.outdir), "--", *command]

    def port(self) -> int:
        """A currently free TCP port on loopback (for MASTER_PORT / rendezvous endpoints)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.ports.append(port)
        return port

    def env(self, slurm: bool = False) -> dict[str, str]:
        """A clean environment: no launcher variables inherited from whatever runs the tests."""
        env = {k: v for k, v in os.environ.items() if not is_launcher_variable(k) and k != "SLURM_CONF"}
        env.pop("DISTINIT_FAKE_HOST", None)
        env.pop("DISTINIT_AGENT", None)
        env["DISTINIT_ORTED_TMP"] = str(self.outdir)
        env["PYTHONUNBUFFERED"] = "1"
        if slurm:
            if self.cluster is None:
                raise LaunchError("this shape needs the Slurm cluster")
            env["SLURM_CONF"] = self.cluster.slurm_conf
        return env

    def torchrun(self) -> str:
        """The torchrun next to the interpreter running the tasks."""
        path = Path(self.python).parent / "torchrun"
        return str(path) if path.exists() else (shutil.which("torchrun") or "torchrun")

    def script(self, name: str, lines: Sequence[Sequence[str]]) -> Path:
        """Write an sbatch script that runs each argv line."""
        path = self.outdir / name
        body = "\n".join(shlex.join(line) for line in lines)
        path.write_text(f"#!/bin/sh\nset -e\n{body}\n", encoding="utf-8")
        path.chmod(0o755)
        return path


Builder = Callable[["Shape", Context, list[str]], list[Launch]]


@dataclass(frozen=True)
class Shape:
    """One way of launching a small world, and what that world must look like.

    Attributes:
        name: Capture file stem and test id.
        launcher: The ``DistEnv.launcher`` every task must resolve to.
        needs: Launcher families that must be installed (slurm, openmpi, mpich, torchrun).
        world_size: Tasks expected (1 for the not-launched shapes, which are a single process).
        nodes: Emulated node names in node-rank order; empty means one node.
        truth: Key of the task record's ``truth`` naming the task's node (``group_rank`` reads
            torchrun's own ``GROUP_RANK``); None when everything is on one node.
        node_rank: ``exact`` (must equal the true node index), ``exact_or_none`` (the launcher
            exports no node index: None or right, never wrong).
        expect_rc: Exit status every task's command must return (2 = not launched).
        worlds: Independent worlds the launch forms (2 for concurrent steps of one job).
        build: Builds the launches for a command.
    """

    name: str
    launcher: str
    needs: tuple[str, ...]
    world_size: int
    build: Builder
    nodes: tuple[str, ...] = ()
    truth: str | None = None
    node_rank: str = "exact"
    expect_rc: int = 0
    description: str = ""
    worlds: int = 1

    def node_of(self, record: dict[str, Any]) -> int:
        """The true node index of a task record."""
        if self.truth is None:
            return 0
        if self.truth == "group_rank":
            return int(record["env"]["GROUP_RANK"])
        name = record["truth"][self.truth]
        if name not in self.nodes:
            raise LaunchError(f"{self.name}: task on unexpected node {name!r} (expected one of {self.nodes})")
        return self.nodes.index(name)


def _srun(shape: Shape, ctx: Context, cmd: list[str], opts: Sequence[str]) -> list[Launch]:
    return [Launch(["srun", "-K1", *SLURM_TIME, *opts, *ctx.task(cmd)], ctx.env(slurm=True))]


def srun(*opts: str) -> Builder:
    """Builder for ``srun OPTS task``."""
    return lambda shape, ctx, cmd: _srun(shape, ctx, cmd, opts)


def salloc(alloc: Sequence[str], inner: Callable[[Context, list[str]], list[str]]) -> Builder:
    """Builder for ``salloc ALLOC <inner argv>`` (the inner argv runs in the allocation's shell)."""

    def build(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
        return [Launch(["salloc", *SLURM_TIME, *alloc, *inner(ctx, cmd)], ctx.env(slurm=True))]

    return build


def sbatch(alloc: Sequence[str], inner: Callable[[Context, list[str]], list[str]]) -> Builder:
    """Builder for ``sbatch --wait ALLOC script`` whose script runs the inner argv."""

    def build(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
        script = ctx.script(f"{shape.name}.sbatch", [inner(ctx, cmd)])
        out = str(ctx.outdir / "slurm-%j.out")
        argv = ["sbatch", "--wait", "-o", out, *SLURM_TIME, *alloc, str(script)]
        return [Launch(argv, ctx.env(slurm=True))]

    return build


def _master_args(ctx: Context, flag: str, explicit_addr: bool) -> list[str]:
    """``-x NAME=value`` / ``-genv NAME value`` for MASTER_PORT (and MASTER_ADDR when asked)."""
    if not ctx.with_master:
        return []
    pairs = [("MASTER_PORT", str(ctx.port()))]
    if explicit_addr:
        pairs.insert(0, ("MASTER_ADDR", "127.0.0.1"))
    out: list[str] = []
    for name, value in pairs:
        out += ["-x", f"{name}={value}"] if flag == "-x" else ["-genv", name, value]
    return out


def openmpi(*opts: str, explicit_addr: bool = True, fake_nodes: bool = True) -> Builder:
    """Builder for ``mpirun.openmpi OPTS task`` (fake nodes through the fake rsh agent)."""

    def build(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
        argv = [*OPENMPI_BASE, *(OPENMPI_FAKE_NODES if fake_nodes else []), *_master_args(ctx, "-x", explicit_addr)]
        return [Launch([*argv, *opts, *ctx.task(cmd)], ctx.env())]

    return build


def hydra(*opts: str, explicit_addr: bool = True) -> Builder:
    """Builder for ``mpiexec.hydra -launcher fork OPTS task`` (made-up host names)."""

    def build(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
        argv = [HYDRA, "-launcher", "fork", *_master_args(ctx, "-genv", explicit_addr), *opts]
        return [Launch([*argv, *ctx.task(cmd)], ctx.env())]

    return build


def _openmpi_in_alloc(ctx: Context, cmd: list[str]) -> list[str]:
    # Inside an allocation Open MPI starts its orteds with srun. Nothing explicit is passed: the
    # resolver must take MASTER_ADDR from the step's node list and MASTER_PORT from the job/step id.
    return [*OPENMPI_BASE, "-n", "4", *ctx.task(cmd)]


def _hydra_in_alloc(ctx: Context, cmd: list[str]) -> list[str]:
    # hydra starts its proxies with srun; as above, nothing explicit.
    return [HYDRA, "-n", "4", *ctx.task(cmd)]


def torchrun_standalone(nproc: int) -> Builder:
    """Builder for ``torchrun --standalone --nproc-per-node N task``."""

    def build(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
        argv = [ctx.torchrun(), "--standalone", f"--nproc-per-node={nproc}", "--no-python", *ctx.task(cmd)]
        return [Launch(argv, ctx.env())]

    return build


def torchrun_agents(nprocs: Sequence[int], backend: str) -> Builder:
    """Builder for one torchrun agent per emulated node on this host (static or c10d rendezvous)."""

    def build(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
        port = ctx.port()
        rdzv_id = f"distinit-{uuid.uuid4().hex[:8]}"
        launches = []
        for i, nproc in enumerate(nprocs):
            argv = [ctx.torchrun(), f"--nnodes={len(nprocs)}", f"--nproc-per-node={nproc}"]
            if backend == "static":
                argv += [f"--node-rank={i}", "--master-addr=127.0.0.1", f"--master-port={port}"]
            else:
                argv += [
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    f"--rdzv-id={rdzv_id}",
                ]
            env = ctx.env()
            env["DISTINIT_AGENT"] = f"agent{i}"
            launches.append(Launch([*argv, "--no-python", *ctx.task(cmd)], env))
        return launches

    return build


def _srun_arbitrary(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
    # --distribution=arbitrary places task i on line i of SLURM_HOSTFILE: rank 0 on the second node.
    hosts = ["dnode2", "dnode1", "dnode1", "dnode2"]
    hostfile = ctx.outdir / "hostfile"
    hostfile.write_text("\n".join(hosts) + "\n", encoding="utf-8")
    env = ctx.env(slurm=True)
    env["SLURM_HOSTFILE"] = str(hostfile)
    if ctx.with_master:
        env["MASTER_ADDR"] = hosts[0]  # the documented remedy: the resolver cannot know rank 0's host
    argv = ["srun", "-K1", *SLURM_TIME, "--distribution=arbitrary", "-n4", *ctx.task(cmd)]
    return [Launch(argv, env)]


def _concurrent_steps(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
    task = shlex.join(ctx.task(cmd))
    script = ctx.outdir / f"{shape.name}.sbatch"
    script.write_text(
        f"#!/bin/sh\nsrun --exact -K1 -N1 -n2 -w dnode1 {task} &\nsrun --exact -K1 -N1 -n2 -w dnode2 {task} &\nwait\n",
        encoding="utf-8",
    )
    out = str(ctx.outdir / "slurm-%j.out")
    argv = ["sbatch", "--wait", "-o", out, *SLURM_TIME, "-N2", "--ntasks-per-node=2", "-w", "dnode[1-2]", str(script)]
    return [Launch(argv, ctx.env(slurm=True))]


def _torchrun_static_in_srun(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
    # The common recipe: one agent per node, --node-rank from SLURM_NODEID, static rendezvous.
    agent = [
        ctx.torchrun(),
        "--nnodes=2",
        "--nproc-per-node=2",
        "--node-rank=$SLURM_NODEID",
        "--master-addr=dnode1",
        f"--master-port={ctx.port()}",
        "--no-python",
        *ctx.task(cmd),
    ]
    line = " ".join(a if a.startswith("--node-rank") else shlex.quote(a) for a in agent)
    opts = ["-N2", "--ntasks-per-node=1", "-w", "dnode[1-2]"]
    return [Launch(["srun", "-K1", *SLURM_TIME, *opts, "sh", "-c", line], ctx.env(slurm=True))]


def _torchrun_in_srun(shape: Shape, ctx: Context, cmd: list[str]) -> list[Launch]:
    port = ctx.port()
    agent = [
        ctx.torchrun(),
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=dnode1:{port}",
        f"--rdzv-id=distinit-{uuid.uuid4().hex[:8]}",
        "--no-python",
        *ctx.task(cmd),
    ]
    opts = ["-N2", "--ntasks-per-node=1", "-w", "dnode[1-2]"]
    return [Launch(["srun", "-K1", *SLURM_TIME, *opts, *agent], ctx.env(slurm=True))]


TWO = ("dnode1", "dnode2")
FAKE = ("fakehost-a", "fakehost-b")

SHAPES: tuple[Shape, ...] = (
    # --- Slurm srun steps -------------------------------------------------------------------
    Shape(
        "slurm-1node",
        "slurm",
        ("slurm",),
        2,
        srun("-N1", "-n2", "-w", "dnode1"),
        ("dnode1",),
        "slurmd_nodename",
        description="srun -N1 -n2",
    ),
    Shape(
        "slurm-block",
        "slurm",
        ("slurm",),
        4,
        srun("-N2", "-n4", "--ntasks-per-node=2", "-w", "dnode[1-2]"),
        TWO,
        "slurmd_nodename",
        description="srun -N2 -n4 --ntasks-per-node=2 (block)",
    ),
    Shape(
        "slurm-cyclic",
        "slurm",
        ("slurm",),
        4,
        srun("-N2", "-n4", "--ntasks-per-node=2", "--distribution=cyclic", "-w", "dnode[1-2]"),
        TWO,
        "slurmd_nodename",
        description="srun -N2 -n4 --ntasks-per-node=2 --distribution=cyclic",
    ),
    Shape(
        "slurm-uneven",
        "slurm",
        ("slurm",),
        3,
        srun("-N2", "-n3", "-w", "dnode[1-2]"),
        TWO,
        "slurmd_nodename",
        description="srun -N2 -n3 (tasks per node 2,1)",
    ),
    Shape(
        "slurm-3node",
        "slurm",
        ("slurm",),
        4,
        srun("-N3", "-n4", "-w", "dnode[1-3]"),
        ("dnode1", "dnode2", "dnode3"),
        "slurmd_nodename",
        description="srun -N3 -n4 (2,1(x2))",
    ),
    Shape(
        "slurm-subset",
        "slurm",
        ("slurm",),
        2,
        salloc(
            ["-N2", "--ntasks-per-node=2", "-w", "dnode[1-2]"],
            lambda ctx, cmd: ["srun", "-K1", "-N1", "-n2", "-w", "dnode2", *ctx.task(cmd)],
        ),
        ("dnode2",),
        "slurmd_nodename",
        description="salloc -N2; srun -N1 -n2 -w dnode2 (subset step)",
    ),
    Shape(
        "slurm-pmi2",
        "slurm",
        ("slurm",),
        4,
        srun("--mpi=pmi2", "-N2", "-n4", "--ntasks-per-node=2", "-w", "dnode[1-2]"),
        TWO,
        "slurmd_nodename",
        description="srun --mpi=pmi2 -N2 -n4",
    ),
    Shape(
        "slurm-pmix",
        "slurm",
        ("slurm",),
        3,
        srun("--mpi=pmix", "-N2", "-n3", "-w", "dnode[2-3]"),
        ("dnode2", "dnode3"),
        "slurmd_nodename",
        description="srun --mpi=pmix -N2 -n3 on dnode[2-3]",
    ),
    Shape(
        "slurm-arbitrary",
        "slurm",
        ("slurm",),
        4,
        _srun_arbitrary,
        TWO,
        "slurmd_nodename",
        description="SLURM_HOSTFILE=(dnode2,dnode1,dnode1,dnode2) srun --distribution=arbitrary -n4",
    ),
    Shape(
        "slurm-het",
        "slurm",
        ("slurm",),
        3,
        salloc(
            ["-N1", "-n1", "-w", "dnode1", ":", "-N1", "-n2", "-w", "dnode2"],
            lambda ctx, cmd: ["srun", "-K1", "--het-group=0,1", *ctx.task(cmd)],
        ),
        TWO,
        "slurmd_nodename",
        description="heterogeneous job salloc -N1 -n1 : -N1 -n2; srun --het-group=0,1 (one world)",
    ),
    Shape(
        "slurm-het-component",
        "slurm",
        ("slurm",),
        2,
        salloc(
            ["-N1", "-n1", "-w", "dnode1", ":", "-N1", "-n2", "-w", "dnode2"],
            lambda ctx, cmd: ["srun", "-K1", "--het-group=1", *ctx.task(cmd)],
        ),
        ("dnode2",),
        "slurmd_nodename",
        description="heterogeneous job salloc -N1 -n1 : -N1 -n2; srun --het-group=1 (second component only)",
    ),
    Shape(
        "slurm-sbatch",
        "slurm",
        ("slurm",),
        4,
        sbatch(["-N2", "--ntasks-per-node=2", "-w", "dnode[1-2]"], lambda ctx, cmd: ["srun", "-K1", *ctx.task(cmd)]),
        TWO,
        "slurmd_nodename",
        description="sbatch --wait -N2 --ntasks-per-node=2 with srun inside",
    ),
    Shape(
        "slurm-batch-step",
        "slurm",
        ("slurm",),
        1,
        sbatch(["-N2", "--ntasks-per-node=2", "-w", "dnode[1-2]"], lambda ctx, cmd: ctx.task(cmd)),
        ("dnode1",),
        "slurmd_nodename",
        expect_rc=2,
        description="sbatch -N2 --ntasks-per-node=2, the batch script itself (no srun)",
    ),
    Shape(
        "slurm-salloc-shell",
        "slurm",
        ("slurm",),
        1,
        salloc(["-N1", "-n2", "-w", "dnode1"], lambda ctx, cmd: ctx.task(cmd)),
        (),
        None,
        expect_rc=2,
        description="salloc -N1 -n2 COMMAND (the allocation's shell, no srun)",
    ),
    Shape(
        "slurm-concurrent-steps",
        "slurm",
        ("slurm",),
        4,
        _concurrent_steps,
        ("dnode1", "dnode2"),
        "slurmd_nodename",
        worlds=2,
        description="sbatch -N2: two concurrent `srun --exact -N1 -n2` steps, one per node (two worlds)",
    ),
    # --- MPI inside a Slurm allocation -----------------------------------------------------------
    Shape(
        "openmpi-in-slurm",
        "openmpi",
        ("slurm", "openmpi"),
        4,
        salloc(["-N2", "--ntasks-per-node=2", "-w", "dnode[1-2]"], _openmpi_in_alloc),
        TWO,
        "slurmd_nodename",
        description="salloc -N2 --ntasks-per-node=2 mpirun.openmpi -n 4",
    ),
    Shape(
        "mpich-in-slurm",
        "mpich",
        ("slurm", "mpich"),
        4,
        salloc(["-N2", "--ntasks-per-node=2", "-w", "dnode[1-2]"], _hydra_in_alloc),
        TWO,
        "slurmd_nodename",
        description="salloc -N2 --ntasks-per-node=2 mpiexec.hydra -n 4",
    ),
    Shape(
        "openmpi-in-sbatch",
        "openmpi",
        ("slurm", "openmpi"),
        4,
        sbatch(["-N2", "--ntasks-per-node=2", "-w", "dnode[2-3]"], _openmpi_in_alloc),
        ("dnode2", "dnode3"),
        "slurmd_nodename",
        description="sbatch -N2 --ntasks-per-node=2 on dnode[2-3], script runs mpirun.openmpi -n 4",
    ),
    Shape(
        "openmpi-in-slurm-subset",
        "openmpi",
        ("slurm", "openmpi"),
        4,
        salloc(
            ["-N3", "--ntasks-per-node=2", "-w", "dnode[1-3]"],
            lambda ctx, cmd: [*OPENMPI_BASE, "--host", "dnode2:2,dnode3:2", "-n", "4", *ctx.task(cmd)],
        ),
        ("dnode2", "dnode3"),
        "slurmd_nodename",
        description="salloc -N3 --ntasks-per-node=2; mpirun.openmpi --host dnode2:2,dnode3:2 -n 4 (no rank on dnode1)",
    ),
    # --- Open MPI ------------------------------------------------------------------------------
    Shape(
        "openmpi-1node",
        "openmpi",
        ("openmpi",),
        3,
        openmpi("-n", "3", explicit_addr=False, fake_nodes=False),
        description="mpirun.openmpi -n 3 (MASTER_PORT passed with -x)",
    ),
    Shape(
        "openmpi-2node",
        "openmpi",
        ("openmpi",),
        4,
        openmpi("--host", f"{FAKE[0]}:2,{FAKE[1]}:2", "-n", "4"),
        FAKE,
        "fake_host",
        "exact_or_none",
        description="mpirun.openmpi --host a:2,b:2 -n 4 (by slot)",
    ),
    Shape(
        "openmpi-2node-bynode",
        "openmpi",
        ("openmpi",),
        4,
        openmpi("--host", f"{FAKE[0]}:2,{FAKE[1]}:2", "--map-by", "node", "-n", "4"),
        FAKE,
        "fake_host",
        "exact_or_none",
        description="mpirun.openmpi --host a:2,b:2 --map-by node -n 4",
    ),
    Shape(
        "openmpi-2node-uneven",
        "openmpi",
        ("openmpi",),
        4,
        openmpi("--host", f"{FAKE[0]}:3,{FAKE[1]}:1", "-n", "4"),
        FAKE,
        "fake_host",
        "exact_or_none",
        description="mpirun.openmpi --host a:3,b:1 -n 4 (uneven slots)",
    ),
    # --- MPICH hydra ---------------------------------------------------------------------------
    Shape(
        "mpich-1node",
        "mpich",
        ("mpich",),
        3,
        hydra("-n", "3", explicit_addr=False),
        description="mpiexec.hydra -launcher fork -n 3 (MASTER_PORT passed with -genv)",
    ),
    Shape(
        "mpich-2node",
        "mpich",
        ("mpich",),
        4,
        hydra("-hosts", ",".join(FAKE), "-ppn", "2", "-n", "4"),
        FAKE,
        "hydra_host",
        "exact_or_none",
        description="mpiexec.hydra -launcher fork -hosts a,b -ppn 2 -n 4",
    ),
    Shape(
        "mpich-2node-rr",
        "mpich",
        ("mpich",),
        3,
        hydra("-hosts", ",".join(FAKE), "-n", "3"),
        FAKE,
        "hydra_host",
        "exact_or_none",
        description="mpiexec.hydra -launcher fork -hosts a,b -n 3 (round robin)",
    ),
    Shape(
        "mpich-2node-uneven",
        "mpich",
        ("mpich",),
        4,
        hydra("-hosts", f"{FAKE[0]}:3,{FAKE[1]}:1", "-n", "4"),
        FAKE,
        "hydra_host",
        "exact_or_none",
        description="mpiexec.hydra -launcher fork -hosts a:3,b:1 -n 4 (uneven slots)",
    ),
    # --- torchrun ------------------------------------------------------------------------------
    Shape(
        "torchrun-1node",
        "torchrun",
        ("torchrun",),
        3,
        torchrun_standalone(3),
        description="torchrun --standalone --nproc-per-node=3",
    ),
    Shape(
        "torchrun-static-2node",
        "torchrun",
        ("torchrun",),
        4,
        torchrun_agents((2, 2), "static"),
        ("agent0", "agent1"),
        "agent",
        description="two torchrun agents, --nnodes=2 --node-rank=0/1, static",
    ),
    Shape(
        "torchrun-c10d-2node",
        "torchrun",
        ("torchrun",),
        3,
        torchrun_agents((1, 2), "c10d"),
        ("agent0", "agent1"),
        "group_rank",
        description="two torchrun agents, c10d rendezvous, --nproc-per-node 1 and 2",
    ),
    Shape(
        "torchrun-static-in-srun",
        "torchrun",
        ("slurm", "torchrun"),
        4,
        _torchrun_static_in_srun,
        TWO,
        "slurmd_nodename",
        description="srun -N2 --ntasks-per-node=1 sh -c 'torchrun --nnodes=2 --node-rank=$SLURM_NODEID "
        "--master-addr=dnode1 --nproc-per-node=2' (static)",
    ),
    Shape(
        "torchrun-in-srun",
        "torchrun",
        ("slurm", "torchrun"),
        4,
        _torchrun_in_srun,
        TWO,
        "group_rank",
        description="srun -N2 --ntasks-per-node=1 torchrun --nnodes=2 --nproc-per-node=2 (c10d)",
    ),
)
SHAPES_BY_NAME = {s.name: s for s in SHAPES}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher's process group (srun forwards it), SIGKILL after 3 s."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)


@dataclass
class Result:
    """What one run of a shape produced."""

    shape: Shape
    records: list[dict[str, Any]]
    launcher_rcs: list[int]
    launcher_output: str
    seconds: float


def run_shape(
    shape: Shape, ctx: Context, command: Sequence[str], timeout: float = 60.0, allow_failure: bool = False
) -> Result:
    """Launch SHAPE running COMMAND in every task; return the task records sorted by launch rank.

    A launcher exiting non-zero is an error unless the shape expects its tasks to fail or
    ALLOW_FAILURE is set; the caller then checks each task's ``rc``, and fewer records than tasks
    are accepted (mpirun aborts the other ranks when the first one fails).

    Raises:
        LaunchError: the launch timed out, a launcher failed unexpectedly, or the number of task
            records is not the shape's world size. The message holds the launchers' output.
    """
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    launches = shape.build(shape, ctx, list(command))
    logs = [ctx.outdir / f"launcher-{i}.log" for i in range(len(launches))]
    procs = []
    start = time.monotonic()
    try:
        for launch, log in zip(launches, logs, strict=True):
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        launch.argv,
                        env=launch.env,
                        cwd=ctx.outdir,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = start + timeout
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise LaunchError(
                    f"{shape.name}: launch did not finish within {timeout} s\n{_output(launches, logs, ctx)}"
                ) from None
    finally:
        for proc in procs:
            _kill_group(proc)
    seconds = time.monotonic() - start
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(ctx.outdir.glob("task-*.json"))]
    rcs = [int(p.returncode) for p in procs]
    output = _output(launches, logs, ctx)
    if allow_failure and any(rcs) and 0 < len(records) <= shape.world_size:
        pass  # a launcher that aborts the job on the first failure (mpirun) may stop the others first
    elif len(records) != shape.world_size:
        raise LaunchError(f"{shape.name}: {len(records)} task records, expected {shape.world_size}\n{output}")
    if shape.expect_rc == 0 and not allow_failure and any(rcs):
        raise LaunchError(f"{shape.name}: launcher exit status {rcs}\n{output}\n{_task_errors(records)}")
    records.sort(key=_launch_rank)
    return Result(shape, records, rcs, output, seconds)


def _launch_rank(record: dict[str, Any]) -> tuple[int, int]:
    env = record["env"]
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if name in env:
            return (int(env[name]), record["pid"])
    return (0, record["pid"])


def _output(launches: Sequence[Launch], logs: Sequence[Path], ctx: Context) -> str:
    parts = []
    for launch, log in zip(launches, logs, strict=True):
        text = log.read_text(errors="replace") if log.exists() else ""
        parts.append(f"$ {shlex.join(launch.argv)}\n{text[-4000:]}")
    for slurm_out in sorted(ctx.outdir.glob("slurm-*.out")):
        parts.append(f"--- {slurm_out.name}\n{slurm_out.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)


def _task_errors(records: Sequence[dict[str, Any]]) -> str:
    return "\n".join(
        f"task pid {r['pid']} rc={r.get('rc')}: {r.get('stderr', '')[-2000:]}" for r in records if r.get("rc")
    )
