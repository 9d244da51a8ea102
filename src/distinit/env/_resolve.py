"""Which launcher describes this process: the precedence table, and the checks every world must pass.

Each launcher family's variables are read by its own module (``read(v) -> candidate | None``); this
module orders them and checks the result. :data:`PRECEDENCE` lists the rules innermost launcher
first, and :func:`resolve` takes the world of the first rule that finds one: a launcher started
*inside* another wins, because the outer one's variables describe its own helper processes. The
outer launchers present are cross-checked against the winner, and every world must then pass the
invariants in :func:`_broken` (an impossible world is a ``ConflictingEnvError``). :data:`LAUNCHED`
orders, the same way, who says how many processes it started (``DistEnv.launched``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

from distinit._port import derived_port
from distinit.env import _batch, _cloud, _explicit, _layout, _mpi, _slurm, _torchrun
from distinit.env._draft import Draft, Vars, not_launched, single
from distinit.env._master import fill_master
from distinit.env._model import DistEnv
from distinit.errors import ConflictingEnvError, IncompleteEnvError


@dataclass(frozen=True)
class _Outer:
    """The launchers whose variables a rule cross-checks against, read together in this order."""

    slurm: _slurm.Slurm | None
    mpi: _mpi.MpiWorld | None
    platform: _cloud.Platform | None


class _Scene:
    """One resolution: the variables, the caller's options, and the launchers read so far."""

    def __init__(self, environ: Mapping[str, str], *, strict: bool, here: str) -> None:
        self.v = Vars(environ)
        self.strict = strict
        self.here = here

    @cached_property
    def outer(self) -> _Outer:
        # Read only once torchrun and a pre-launch pod are ruled out: their variables make these moot.
        return _Outer(slurm=_slurm.read(self.v), mpi=_mpi.read(self.v), platform=_cloud.read(self.v))


def _torchrun_worker(scene: _Scene) -> Draft | None:
    """A torchrun worker (``TORCHELASTIC_RUN_ID``): ``SLURM_*``/``OMPI_*`` around it describe its agent."""
    return _torchrun.read(scene.v)


def _prelaunch_pod(scene: _Scene) -> Draft | None:
    """A Kubeflow/PAI pod whose RANK is a pod index that torchrun was meant to expand."""
    found = _cloud.prelaunch(scene.v)
    if found is None:
        return None
    variable, what = found
    return not_launched(
        what,
        strict=scene.strict,
        variables=(variable, "RANK", "WORLD_SIZE"),
        why="the platform expects torchrun to start the workers, so RANK is not a process rank here.",
        fix="start the container's command with torchrun (it reads PET_NNODES, PET_NPROC_PER_NODE, "
        "PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT).",
    )


def _mpi_rank(scene: _Scene) -> Draft | None:
    """An MPI-family launcher; a Slurm step around it is mpirun's daemon step, unless srun's own plugin."""
    v, outer = scene.v, scene.outer
    if outer.mpi is None:
        return None
    if outer.slurm is not None and outer.slurm.in_step and outer.mpi.srun_plugin_only:
        draft = _slurm.plugin_world(v, outer.slurm, outer.mpi)
        _explicit.check_agreement(v, draft, here=scene.here)
        return draft
    draft = _mpi.to_draft(outer.mpi, v)
    if outer.mpi.get("node_rank") is not None:
        draft.trusted_node_rank = True
    if outer.slurm is not None:
        _slurm.daemon_step_facts(v, outer.slurm, draft, launch_id=_mpi.launch_id(v))
    else:
        _batch_job(v, draft)
    if outer.mpi.launcher == "lsf":
        _batch.lsf_hosts(v, draft)
    if outer.platform is not None:
        _cloud.apply(outer.platform, draft, per_host=False)
    _explicit.check_agreement(v, draft, here=scene.here)
    if draft.node_rank is None:
        _layout.derive_node_rank(v, draft, family=outer.mpi.families[0].name)
    return draft


def _batch_job(v: Vars, draft: Draft) -> None:
    """Job id and derived port of an MPI launch outside Slurm: the LSF/PBS job and the launch's own id."""
    job = _batch.read(v)
    launch = _mpi.launch_id(v)
    if job is not None:
        draft.put("job_id", job.job_id, job.job_var)
    elif launch is not None:
        draft.put("job_id", launch, "MPI launch id")
    parts = [part for part in (None if job is None else job.job_id, launch) if part]
    if parts:
        draft.put("master_port", derived_port(*parts), "rule: hash(job id, MPI launch id)")


def _exported_rank(scene: _Scene) -> Draft | None:
    """Exported RANK/WORLD_SIZE (DeepSpeed, Kubeflow, Azure ML, job scripts); in an srun step, checked."""
    v, outer = scene.v, scene.outer
    draft = _explicit.read(v)
    if draft is None:
        return None
    if outer.slurm is not None and outer.slurm.in_step:
        return _slurm.exported_in_step(v, outer.slurm, draft, here=scene.here)
    _explicit.fill_locals(v, draft)
    if outer.platform is not None and outer.platform.launcher == draft.launcher:
        _cloud.apply(outer.platform, draft, per_host=False)
    _explicit.settle_node_rank(draft)
    _explicit.default_port(v, draft)
    return draft


def _srun_task(scene: _Scene) -> Draft | None:
    """A task of an srun step (``SLURM_STEP_ID`` and ``SLURM_PROCID``)."""
    slurm = scene.outer.slurm
    if slurm is None or not slurm.in_step:
        return None
    draft = _slurm.task_world(scene.v, slurm)
    _explicit.check_agreement(scene.v, draft, here=scene.here)
    return draft


def _slurm_allocation(scene: _Scene) -> Draft | None:
    """The batch script or a salloc shell of a Slurm job (no step)."""
    slurm = scene.outer.slurm
    return None if slurm is None else _slurm.allocation_world(scene.v, slurm, strict=scene.strict)


def _platform_host(scene: _Scene) -> Draft | None:
    """A cloud platform that runs the script once per host (SageMaker, Vertex AI), or only names itself."""
    platform = scene.outer.platform
    if platform is None:
        return None
    per_host = _cloud.per_host_world(platform)
    if per_host is not None:
        return per_host
    draft = single(f"{platform.launcher} platform variables without a rank or host list: one process.")
    draft.launcher = platform.launcher
    return draft


def _no_launcher(scene: _Scene) -> Draft:
    """No launcher: one process, unless stray torch variables claim otherwise."""
    _reject_partial(scene.v)
    return single(_batch.batch_note(scene.v) or "no launcher variables found: one process (RANK=0, WORLD_SIZE=1).")


#: The precedence, innermost launcher first: resolve() takes the first rule that returns a world.
#: The last rule always returns one.
PRECEDENCE: tuple[Callable[[_Scene], Draft | None], ...] = (
    _torchrun_worker,
    _prelaunch_pod,
    _mpi_rank,
    _exported_rank,
    _srun_task,
    _slurm_allocation,
    _platform_host,
    _no_launcher,
)


#: Who says how many processes it started, innermost first, for a world torchrun did not start (a torchrun
#: worker's count is torchrun's own, read with its world: the MPI/Slurm counts around it count its agents).
#: Read whatever rule found the world, so an exported WORLD_SIZE can be compared with what was started.
LAUNCHED: tuple[Callable[[Vars], tuple[str, int] | None], ...] = (_mpi.launched, _slurm.launched)


def _launched(v: Vars, draft: Draft) -> None:
    """Record the launcher's own process count (``launched``): the first of :data:`LAUNCHED` that says one."""
    if draft.launcher == "torchrun":
        return
    found = next((said for said in (read(v) for read in LAUNCHED) if said is not None), None)
    if found is not None:
        draft.put("launched", found[1], found[0])


def resolve(environ: Mapping[str, str], *, strict: bool, here: str = "") -> DistEnv:
    """Resolve ``environ`` into a validated :class:`DistEnv` (see ``env_from_scheduler``)."""
    scene = _Scene(environ, strict=strict, here=here)
    draft = next(world for world in (rule(scene) for rule in PRECEDENCE) if world is not None)
    _launched(scene.v, draft)
    fill_master(scene.v, draft, here=here)
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
        launched=draft.launched,
        agent_store=draft.agent_store,
        sources=dict(draft.sources),
        notes=tuple(draft.notes),
    )


def _reject_partial(v: Vars) -> None:
    """Stray torch variables without RANK/WORLD_SIZE or a launcher: refuse rather than guess."""
    partial = v.present("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")
    if partial:
        raise IncompleteEnvError(
            f"{', '.join(f'{name}={v.quoted(name)}' for name in partial)} set without RANK and WORLD_SIZE or a "
            "launcher.",
            variables=(*partial, "RANK", "WORLD_SIZE"),
            why="a process cannot know its global rank from a local or node rank (RANK = NODE_RANK * n + "
            "LOCAL_RANK is wrong for uneven and cyclic layouts).",
            fix="start the processes with a launcher (torchrun, srun, mpirun), or export RANK and WORLD_SIZE too.",
        )


def _broken(draft: Draft) -> tuple[str, tuple[str, ...]] | None:
    """The first invariant ``draft`` breaks, in words with values and sources, and its fields; else None."""
    lws, local_rank, nodes, world = draft.local_world_size, draft.local_rank, draft.num_nodes, draft.world_size

    def show(field: str) -> str:
        return f"{getattr(draft, field)} ({'/'.join(draft.sources.get(field, (field,)))})"

    local_bound, local_label = ("local_world_size", "local world size") if lws else ("world_size", "world size")
    checks = (
        (draft.rank < world, f"rank {show('rank')} is not below the world size {show('world_size')}",
         ("rank", "world_size")),
        (lws is None or lws <= world,
         f"local world size {show('local_world_size')} exceeds the world size {show('world_size')}",
         ("local_world_size", "world_size")),
        (local_rank is None or local_rank < (lws or world),
         f"local rank {show('local_rank')} is not below the {local_label} {show(local_bound)}",
         ("local_rank", local_bound)),
        # Every launcher numbers a node's processes in the order of their global ranks, so the local_rank
        # processes before this one on its node all hold smaller ranks.
        (local_rank is None or local_rank <= draft.rank,
         f"local rank {show('local_rank')} exceeds the rank {show('rank')}, which no launcher does",
         ("local_rank", "rank")),
        (nodes is None or nodes <= world,
         f"number of nodes {show('num_nodes')} exceeds the world size {show('world_size')}",
         ("num_nodes", "world_size")),
        # This node runs local_world_size processes and every other node at least one.
        (nodes is None or lws is None or lws + nodes - 1 <= world,
         f"number of nodes {show('num_nodes')} is more than the world allows: this node runs "
         f"{show('local_world_size')} of {show('world_size')} processes, which leaves room for at most "
         f"{world - (lws or 0) + 1} nodes",
         ("num_nodes", "local_world_size", "world_size")),
        (nodes is None or draft.node_rank is None or draft.node_rank < nodes,
         f"node rank {show('node_rank')} is not below the number of nodes {show('num_nodes')}",
         ("node_rank", "num_nodes")),
    )  # fmt: skip
    for holds, what, fields in checks:
        if not holds:
            return what, fields
    return None


def _validate(draft: Draft) -> None:
    """Range checks with the variables named, before the model's own backstop validation."""
    broken = _broken(draft)
    if broken is None:
        return
    what, fields = broken
    raise ConflictingEnvError(
        f"{what}.",
        variables=tuple(draft.sources.get(field, (field,))[0] for field in fields),
        why="the launcher variables describe an impossible world; some were probably exported by hand or "
        "inherited from another job or step.",
        fix="remove hand-written RANK/WORLD_SIZE/LOCAL_*/NODE_RANK exports and let the launcher set them.",
    )


def where() -> str:
    """`` on host H, pid P`` for messages about this process's own environment."""
    return f" on host {socket.gethostname()}, pid {os.getpid()}"
