"""Precedence between launchers, cross-checks, and the master address and port rules.

Nothing launcher-specific lives here; each family's variables are read by its own module. The order,
innermost launcher first (a launcher started *inside* another wins, because the outer one's variables
describe its own helper processes)::

    torchrun > MPI families > explicit RANK/WORLD_SIZE > Slurm step > cloud platforms > nothing

A Slurm step under mpirun/hydra is a daemon step (its SLURM_PROCID is a node index) unless only
srun's own MPI plugin variables are present and agree with it, in which case srun is the launcher.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping

from distinit.env import _cloud, _explicit, _mpi, _slurm, _torchrun
from distinit.env._draft import Draft, Vars, hashed_port
from distinit.env._model import DistEnv
from distinit.errors import ConflictingEnvError, IncompleteEnvError, MalformedEnvError, NotLaunchedError

#: The precedence, innermost launcher first; resolve() follows this order.
PRECEDENCE = ("torchrun", "mpi", "explicit", "slurm-step", "platform", "none")

#: The explicit torch variables checked against any launcher that is not itself their source.
_EXPLICIT = (
    ("RANK", "rank"),
    ("WORLD_SIZE", "world_size"),
    ("LOCAL_RANK", "local_rank"),
    ("LOCAL_WORLD_SIZE", "local_world_size"),
)


def resolve(environ: Mapping[str, str], *, strict: bool, here: str = "") -> DistEnv:
    """Resolve ``environ`` into a validated :class:`DistEnv` (see ``env_from_scheduler``)."""
    v = Vars(environ)
    draft = _torchrun.read(v)
    if draft is None:
        draft = _launched_world(v, strict=strict, here=here)
    _fill_master(v, draft)
    _validate(draft)
    return DistEnv(
        rank=draft.rank,
        local_rank=draft.local_rank if draft.local_rank is not None else 0,
        world_size=draft.world_size,
        local_world_size=draft.local_world_size,
        node_rank=draft.node_rank,
        num_nodes=draft.num_nodes,
        master_addr=draft.master_addr,
        master_port=draft.master_port,
        launcher=draft.launcher,
        job_id=draft.job_id,
        restart_count=draft.restart_count,
        sources=dict(draft.sources),
        notes=tuple(draft.notes),
    )


def _launched_world(v: Vars, *, strict: bool, here: str) -> Draft:
    pre = _cloud.prelaunch(v)
    if pre is not None:
        return _not_launched(
            strict,
            pre[1],
            variables=(pre[0], "RANK", "WORLD_SIZE"),
            why="the platform expects torchrun to start the workers, so RANK is not a process rank here.",
            fix="start the container's command with torchrun (it reads PET_NNODES, PET_NPROC_PER_NODE, "
            "PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT).",
        )
    slurm = _slurm.read(v)
    mpi = _mpi.read(v)
    platform = _cloud.platform(v)
    if mpi is not None:
        return _mpi_world(v, mpi, slurm, platform, here)
    explicit = _explicit.read(v)
    if explicit is not None:
        if slurm is not None and slurm.in_step:
            return _explicit_in_step(v, explicit, slurm, here)
        _explicit.fill_locals(v, explicit)
        if platform is not None and platform.launcher == explicit.launcher:
            _cloud.apply(platform, explicit, per_host=False)
        _explicit_port(v, explicit)
        return explicit
    if slurm is not None and slurm.in_step:
        draft = _slurm.launching_step(v, slurm)
        _check_explicit(v, draft, here)
        return draft
    if slurm is not None:
        tasks, sources = _slurm.allocation_tasks(v)
        if tasks > 1:
            return _not_launched(
                strict,
                f"this process runs in Slurm job {slurm.job_id} ({slurm.job_var} is set) but was not started by srun "
                f"(SLURM_STEP_ID is absent): it is the batch script or a salloc shell of an allocation of "
                f"{tasks} tasks ({', '.join(sources) or 'SLURM_JOB_NUM_NODES'}).",
                variables=(slurm.job_var, "SLURM_STEP_ID", *sources),
                why=f"without srun only this one process runs; the other {tasks - 1} ranks never arrive and "
                "init would hang until its timeout.",
                fix="launch the training command with srun inside the job script (`srun python train.py`), or "
                "pass strict=False (--no-strict) to run a single process on purpose.",
                job_id=slurm.job_id,
            )
        draft = _single(f"Slurm job {slurm.job_id} with a single task, outside any srun step: one process.")
        draft.launcher = "slurm"
        draft.put("job_id", slurm.job_id, slurm.job_var)
        draft.put("master_port", hashed_port(slurm.job_id, "batch"), "rule: hash(SLURM_JOB_ID, batch)")
        return draft
    if platform is not None:
        per_host = _cloud.per_host_world(platform)
        if per_host is not None:
            return per_host
        draft = _single(f"{platform.launcher} platform variables without a rank or host list: one process.")
        draft.launcher = platform.launcher
        return draft
    _reject_partial(v)
    if v.has("PBS_JOBID", "PBS_NODEFILE"):
        return _single("PBS batch script (PBS_JOBID) without mpiexec: one process.")
    if v.has("LSB_JOBID"):
        return _single("LSF batch script (LSB_JOBID) without jsrun or mpirun: one process.")
    return _single("no launcher variables found: one process (RANK=0, WORLD_SIZE=1).")


def _single(note: str) -> Draft:
    draft = Draft(launcher="none", rank=0, world_size=1)
    draft.sources.update(rank=("rule: not launched",), world_size=("rule: not launched",))
    draft.put("local_rank", 0, "rule: not launched")
    draft.put("local_world_size", 1, "rule: not launched")
    draft.put("node_rank", 0, "rule: not launched")
    draft.put("num_nodes", 1, "rule: not launched")
    draft.note(note)
    return draft


def _not_launched(
    strict: bool, what: str, *, variables: tuple[str, ...], why: str, fix: str, job_id: str | None = None
) -> Draft:
    if strict:
        raise NotLaunchedError(what, variables=variables, why=why, fix=fix)
    draft = _single(f"not launched ({what}); strict=False: running as a single process.")
    draft.put("job_id", job_id, variables[0])
    return draft


def _reject_partial(v: Vars) -> None:
    """Stray torch variables without RANK/WORLD_SIZE or a launcher: refuse rather than guess."""
    partial = v.present("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")
    if partial:
        raise IncompleteEnvError(
            f"{', '.join(f'{name}={v.raw(name)!r}' for name in partial)} set without RANK and WORLD_SIZE or a "
            "launcher.",
            variables=(*partial, "RANK", "WORLD_SIZE"),
            why="a process cannot know its global rank from a local or node rank (RANK = NODE_RANK * n + "
            "LOCAL_RANK is wrong for uneven and cyclic layouts).",
            fix="start the processes with a launcher (torchrun, srun, mpirun), or export RANK and WORLD_SIZE too.",
        )


def _mpi_world(
    v: Vars, mpi: _mpi.MpiWorld, slurm: _slurm.Slurm | None, platform: _cloud.Platform | None, here: str
) -> Draft:
    if slurm is not None and slurm.in_step and mpi.srun_plugin_only:
        draft = _slurm.launching_step(v, slurm)
        for field, target in (("rank", "rank"), ("size", "world_size"), ("local_rank", "local_rank")):
            value = mpi.get(field)
            if value is not None and value != getattr(draft, target):
                source = draft.sources[target][0]
                raise ConflictingEnvError(
                    f"{mpi.source(field)}={value} disagrees with {source}={getattr(draft, target)} in srun step "
                    f"{slurm.job_id}.{slurm.step_id}.",
                    variables=(mpi.source(field), source),
                    why="srun's MPI plugin sets both from the same task layout; one of them is stale or exported.",
                    fix="do not export PMI_*/PMIX_*/SLURM_* variables; launch with srun --mpi=<plugin>.",
                )
        if mpi.get("node_rank") is not None and mpi.get("node_rank") != draft.node_rank:
            raise ConflictingEnvError(
                f"{mpi.source('node_rank')}={mpi.get('node_rank')} disagrees with SLURM_NODEID={draft.node_rank}.",
                variables=(mpi.source("node_rank"), "SLURM_NODEID"),
                fix="do not export PALS_*/SLURM_* variables; launch with srun --mpi=cray_shasta.",
            )
        draft.note(f"{', '.join(f.name for f in mpi.families)} variables agree with the srun step (srun --mpi).")
        _check_explicit(v, draft, here)
        return draft
    draft = _mpi.to_draft(mpi, v)
    if mpi.get("node_rank") is not None:
        draft.trusted_node_rank = True
    mpi_job = _mpi.launch_id(v)
    if slurm is not None:
        _slurm.daemon_step_facts(v, slurm, draft)
        draft.put(
            "master_port",
            hashed_port(slurm.job_id, "mpi", mpi_job or ""),
            f"rule: hash({slurm.job_var}, {'MPI launch id' if mpi_job else 'mpi'})",
        )
    else:
        scheduler_job = v.first("LSB_JOBID", "PBS_JOBID")
        if scheduler_job is not None:
            draft.put("job_id", scheduler_job[1], scheduler_job[0])
        elif mpi_job is not None:
            draft.put("job_id", mpi_job, "MPI launch id")
        parts = [part for part in (scheduler_job[1] if scheduler_job else None, mpi_job) if part]
        if parts:
            draft.put("master_port", hashed_port(*parts), "rule: hash(job id, MPI launch id)")
    if mpi.launcher == "lsf":
        _lsf_hosts(v, draft)
    if platform is not None:
        _cloud.apply(platform, draft, per_host=False)
    _check_explicit(v, draft, here)
    if draft.node_rank is None:
        _block_node_rank(draft)
    return draft


def _lsf_hosts(v: Vars, draft: Draft) -> None:
    """Rank 0's host and the node count from ``LSB_MCPU_HOSTS`` ('host ncpu' pairs, launch node first)."""
    text = v.text("LSB_MCPU_HOSTS")
    if text is None:
        return
    words = text.split()
    if len(words) % 2 or not all(count.isdigit() for count in words[1::2]):
        raise MalformedEnvError(
            f"LSB_MCPU_HOSTS={v.raw('LSB_MCPU_HOSTS')!r} is not a list of 'host slots' pairs.",
            variables=("LSB_MCPU_HOSTS",),
            fix="do not override LSB_MCPU_HOSTS; LSF sets it.",
        )
    hosts = words[0::2]
    compute = hosts[1:] if len(hosts) > 1 else hosts
    draft.put("master_addr", compute[0], "LSB_MCPU_HOSTS")
    if draft.num_nodes is None:
        draft.put("num_nodes", len(compute), "LSB_MCPU_HOSTS")
    draft.note("LSB_MCPU_HOSTS: the first host is jsrun's launch node; rank 0 is assumed on the first compute host.")


def _block_node_rank(draft: Draft) -> None:
    """Node rank from the layout: certain on one node, else a block-layout assumption when consistent.

    With the whole world on this node the answer is certain (node 0 of 1). Otherwise the block rule
    ``(RANK - LOCAL_RANK) / LOCAL_WORLD_SIZE`` applies only when integral and consistent with what is
    known (a known node count must give uniform nodes); it is recorded in ``notes``. One rank cannot
    tell a block layout from an uneven or round-robin one (hydra with hosts a:3,b:1 gives rank 3 the
    view of "4 nodes of 1"), so the assumption can be wrong there: export NODE_RANK in such layouts.
    """
    lws, world = draft.local_world_size, draft.world_size
    if lws is None or draft.local_rank is None:
        return
    if lws == world:
        draft.put("node_rank", 0, "rule: whole world on this node")
        draft.put("num_nodes", 1, "rule: whole world on this node")
        draft.trusted_node_rank = True
        return
    offset = draft.rank - draft.local_rank
    if world % lws or offset < 0 or offset % lws:
        return
    if draft.num_nodes is not None and draft.num_nodes * lws != world:
        return
    draft.put("node_rank", offset // lws, "rule: (RANK - LOCAL_RANK) / LOCAL_WORLD_SIZE")
    # num_nodes is not derived: with an uneven or round-robin layout one rank cannot see the node count.
    draft.trusted_node_rank = False
    draft.note(
        f"node_rank={offset // lws} assumes a block layout ({lws} consecutive ranks per node); it is wrong for "
        "uneven hosts and round-robin mappings (mpirun --map-by node). Export NODE_RANK if you map ranks otherwise."
    )


def _explicit_in_step(v: Vars, explicit: Draft, slurm: _slurm.Slurm, here: str) -> Draft:
    """Explicit RANK/WORLD_SIZE inside an srun step: they must describe the step's own tasks."""
    draft = _slurm.launching_step(v, slurm)
    agree = explicit.rank == draft.rank and explicit.world_size == draft.world_size
    if agree:
        draft.note("RANK and WORLD_SIZE are also exported and agree with the srun step.")
        _check_explicit(v, draft, here)
        return draft
    if draft.world_size == 1 and (draft.num_nodes or 1) == 1:
        # A one-task step running its own per-node spawner that exports RANK for its children.
        explicit.note(
            f"RANK/WORLD_SIZE were exported inside a one-task srun step ({slurm.job_id}.{slurm.step_id}): "
            "a process spawner inside the step is assumed to have set them."
        )
        explicit.put("job_id", slurm.job_id, slurm.job_var)
        _explicit.fill_locals(v, explicit)
        _explicit_port(v, explicit)
        return explicit
    variables = (
        ("RANK", "SLURM_PROCID") if explicit.rank != draft.rank else ("WORLD_SIZE", draft.sources["world_size"][0])
    )
    raise ConflictingEnvError(
        f"RANK={explicit.rank}, WORLD_SIZE={explicit.world_size} (exported) disagree with the srun step: "
        f"SLURM_PROCID={draft.rank} of {draft.sources['world_size'][0]}={draft.world_size}{here}.",
        variables=variables,
        why="an `export RANK=...`/`WORLD_SIZE=...` in the job script is inherited by every task srun starts, "
        "or the values were computed as NODE_RANK * n + LOCAL_RANK.",
        fix="remove RANK and WORLD_SIZE from the job script (distinit reads the srun step), or start one torchrun "
        "per node (torchrun sets TORCHELASTIC_RUN_ID and its own RANK).",
    )


def _explicit_port(v: Vars, draft: Draft) -> None:
    if draft.master_port is None and draft.job_id is not None and not v.has("MASTER_PORT"):
        draft.put("master_port", hashed_port(draft.job_id, "env"), "rule: hash(job id)")


def _check_explicit(v: Vars, draft: Draft, here: str) -> None:
    """Exported torch variables must agree with the launcher's values; NODE_RANK fills an assumption."""
    launcher = draft.launcher
    for name, field in _EXPLICIT:
        exported = v.integer(name, minimum=1 if name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") else 0)
        value = getattr(draft, field)
        if exported is None or value is None or exported == value:
            continue
        source = draft.sources.get(field, ("the launcher",))[0]
        raise ConflictingEnvError(
            f"{name}={v.raw(name)!r} (exported) disagrees with {source}={value!r} ({launcher}, the innermost "
            f"launcher){here}.",
            variables=(name, source),
            why=f"an `export {name}=...` in the job script is inherited by every process the launcher starts, so "
            "several processes claim the same value.",
            fix=f"remove {name} from the job script (distinit reads {launcher}'s variables), or launch with torchrun.",
        )
    found = v.first_integer("NODE_RANK", "GROUP_RANK")
    if found is None:
        return
    name, exported = found
    if draft.node_rank is None or not draft.trusted_node_rank:
        if draft.num_nodes is not None and exported >= draft.num_nodes and draft.trusted_node_rank:
            raise ConflictingEnvError(
                f"{name}={exported} (exported) is not below the number of nodes {draft.num_nodes}{here}.",
                variables=(name, *draft.sources.get("num_nodes", ())),
                fix=f"export {name} as this node's index, from 0, or unset it.",
            )
        draft.put("node_rank", exported, name)
        draft.trusted_node_rank = True
        return
    if exported != draft.node_rank:
        source = draft.sources["node_rank"][0]
        raise ConflictingEnvError(
            f"{name}={exported} (exported) disagrees with {source}={draft.node_rank} ({launcher}){here}.",
            variables=(name, source),
            why=f"an `export {name}=...` in the job script is inherited by every node, so several nodes claim the "
            "same node rank.",
            fix=f"remove {name} from the job script; distinit takes the node rank from {source}.",
        )


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _fill_master(v: Vars, draft: Draft) -> None:
    """MASTER_ADDR: explicit > launcher/platform host > 127.0.0.1 when the world is on this node > None."""
    address = v.text("MASTER_ADDR")
    if address is not None:
        _check_address(address)
        draft.put("master_addr", address, "MASTER_ADDR")
    elif draft.master_addr is None:
        if draft.world_size == 1 or draft.local_world_size == draft.world_size or draft.num_nodes == 1:
            draft.put("master_addr", "127.0.0.1", "rule: whole world on this node")
        elif draft.world_size > 1:
            draft.note(
                "MASTER_ADDR is unknown: the launcher does not say which host runs rank 0. Pass it to every "
                "process (e.g. `mpirun -x MASTER_ADDR=<rank 0 host>` or `mpiexec -genv MASTER_ADDR <host>`)."
            )
    port = v.integer("MASTER_PORT", minimum=1)
    if port is not None:
        if port > 65535:
            raise MalformedEnvError(
                f"MASTER_PORT={port} is not a TCP port (1-65535).",
                variables=("MASTER_PORT",),
                fix="export MASTER_PORT as a free port, e.g. between 20000 and 32767.",
            )
        draft.put("master_port", port, "MASTER_PORT")
    elif draft.master_port is None and draft.world_size > 1:
        draft.note("MASTER_PORT is unknown: export MASTER_PORT (the same free port on every process).")


def _check_address(address: str) -> None:
    if any(char.isspace() for char in address) or "://" in address:
        raise MalformedEnvError(
            f"MASTER_ADDR={address!r} is not a host name or address.",
            variables=("MASTER_ADDR",),
            fix="export MASTER_ADDR as rank 0's host name or IP address, without scheme or spaces.",
        )
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and not _is_ipv6(address):
        raise MalformedEnvError(
            f"MASTER_ADDR={address!r} includes a port.",
            variables=("MASTER_ADDR", "MASTER_PORT"),
            fix=f"export MASTER_ADDR={host} and MASTER_PORT={port} separately.",
        )


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).version == 6
    except ValueError:
        return False


def _validate(draft: Draft) -> None:
    """Range checks with the variables named, before the model's own backstop validation."""
    lws = draft.local_world_size
    # (holds, smaller field, its label, larger field, its label, relation in words)
    rules = (
        (draft.rank < draft.world_size, "rank", "rank", "world_size", "the world size", "is not below"),
        (
            lws is None or lws <= draft.world_size,
            "local_world_size",
            "local world size",
            "world_size",
            "the world size",
            "exceeds",
        ),
        (
            draft.local_rank is None or draft.local_rank < (lws or draft.world_size),
            "local_rank",
            "local rank",
            "local_world_size" if lws else "world_size",
            "the local world size" if lws else "the world size",
            "is not below",
        ),
        (
            draft.num_nodes is None or draft.num_nodes <= draft.world_size,
            "num_nodes",
            "number of nodes",
            "world_size",
            "the world size",
            "exceeds",
        ),
        (
            draft.num_nodes is None or draft.node_rank is None or draft.node_rank < draft.num_nodes,
            "node_rank",
            "node rank",
            "num_nodes",
            "the number of nodes",
            "is not below",
        ),
    )
    for holds, small, small_label, large, large_label, relation in rules:
        if holds:
            continue
        small_src = "/".join(draft.sources.get(small, (small,)))
        large_src = "/".join(draft.sources.get(large, (large,)))
        raise ConflictingEnvError(
            f"{small_label} {getattr(draft, small)} ({small_src}) {relation} {large_label} "
            f"{getattr(draft, large)} ({large_src}).",
            variables=(draft.sources.get(small, (small,))[0], draft.sources.get(large, (large,))[0]),
            why="the launcher variables describe an impossible world; some were probably exported by hand or "
            "inherited from another job or step.",
            fix="remove hand-written RANK/WORLD_SIZE/LOCAL_*/NODE_RANK exports and let the launcher set them.",
        )


def where() -> str:
    """`` on host H, pid P`` for messages about this process's own environment."""
    return f" on host {socket.gethostname()}, pid {os.getpid()}"
