"""Slurm: srun steps (also through srun's MPI plugins), batch scripts, salloc shells, and mpirun/hydra daemon steps.

Slurm has two scopes. Inside an srun step, ``SLURM_NODELIST``/``SLURM_JOB_NODELIST`` and
``SLURM_NTASKS_PER_NODE`` still describe the whole *job*, so a step on a subset of nodes gets a
wrong master from them. The step-scope variables (``SLURM_STEP_NODELIST``, ``SLURM_STEP_NUM_TASKS``,
``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_GTIDS``) are the truth, and only ``SLURM_STEP_ID`` (legacy
``SLURM_STEPID``) tells an srun task from a batch script that merely looks like rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from distinit._hostlist import expand_counts, expand_hostlist
from distinit._port import derived_port, master_addr_fix
from distinit._text import clipped, decimal
from distinit.env import _explicit
from distinit.env._draft import Draft, Vars, not_launched, single
from distinit.env._mpi import MpiWorld
from distinit.errors import ConflictingEnvError, IncompleteEnvError, MalformedEnvError

_RESTART = "SLURM_RESTART_COUNT"


@dataclass(frozen=True)
class Slurm:
    """What the Slurm variables of one process say, before deciding who launched it."""

    job_id: str
    job_var: str
    step_id: str | None
    step_var: str | None
    procid: int | None
    heterogeneous: bool

    @property
    def job(self) -> str:
        """The job id for messages (cut when a hostile value is long)."""
        return clipped(self.job_id)

    @property
    def step(self) -> str:
        """``job.step`` for messages (cut when a hostile value is long)."""
        return clipped(f"{self.job_id}.{self.step_id}")

    @property
    def in_step(self) -> bool:
        """Whether this process is a task of an srun step (not the batch script or a salloc shell)."""
        return self.step_id is not None and self.procid is not None


def launched(v: Vars) -> tuple[str, int] | None:
    """``(variable, count)``: how many tasks this srun step started; None outside a step.

    Only the step's count: a batch script's ``SLURM_NTASKS`` is what the allocation may run, not what was started.
    """
    return v.first_count("SLURM_STEP_NUM_TASKS")


def read(v: Vars) -> Slurm | None:
    """The Slurm job this process belongs to, or ``None`` outside Slurm."""
    job = v.first("SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        if v.has("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID"):
            raise IncompleteEnvError(
                "SLURM_STEP_ID/SLURM_PROCID are set but SLURM_JOB_ID is not.",
                variables=("SLURM_JOB_ID", *v.present("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID")),
                why="srun always sets SLURM_JOB_ID; a partial set usually comes from a hand-written export.",
                fix="launch with srun, or unset the stray SLURM_* variables.",
            )
        return None
    step = v.first("SLURM_STEP_ID", "SLURM_STEPID")
    return Slurm(
        job_id=job[1],
        job_var=job[0],
        step_id=step[1] if step else None,
        step_var=step[0] if step else None,
        procid=v.integer("SLURM_PROCID"),
        heterogeneous=v.has("SLURM_HET_SIZE", "SLURM_PACK_SIZE"),
    )


def _allocation_tasks(v: Vars) -> tuple[int, tuple[str, ...]]:
    """Tasks of the whole allocation (batch script / salloc shell scope) and the variables read."""
    found = v.first_integer("SLURM_NTASKS", "SLURM_NPROCS", minimum=1)
    if found is not None:
        return found[1], (found[0],)
    tasks_per_node = v.text("SLURM_TASKS_PER_NODE")
    if tasks_per_node is not None:
        return sum(expand_counts(tasks_per_node, variable="SLURM_TASKS_PER_NODE")), ("SLURM_TASKS_PER_NODE",)
    nodes = v.integer("SLURM_JOB_NUM_NODES", minimum=1) or v.integer("SLURM_NNODES", minimum=1)
    if nodes is not None and nodes > 1:
        return nodes, ("SLURM_JOB_NUM_NODES",)
    return 1, ()


def allocation_world(v: Vars, slurm: Slurm, *, strict: bool) -> Draft:
    """A process of a Slurm job outside any srun step: the batch script or a salloc shell.

    Raises:
        NotLaunchedError: strict mode and the allocation has more than one task.
    """
    tasks, sources = _allocation_tasks(v)
    if tasks > 1:
        return not_launched(
            f"this process runs in Slurm job {slurm.job} ({slurm.job_var} is set) but was not started by srun "
            f"(SLURM_STEP_ID is absent): it is the batch script or a salloc shell of an allocation of "
            f"{tasks} tasks ({', '.join(sources) or 'SLURM_JOB_NUM_NODES'}).",
            strict=strict,
            variables=(slurm.job_var, "SLURM_STEP_ID", *sources),
            why=f"without srun only this one process runs; the other {tasks - 1} ranks never arrive and "
            "init would hang until its timeout.",
            fix="launch the training command with srun inside the job script (`srun python train.py`), or "
            "pass strict=False (--no-strict) to run a single process on purpose.",
            job_id=slurm.job_id,
        )
    draft = single(f"Slurm job {slurm.job} with a single task, outside any srun step: one process.")
    draft.launcher = "slurm"
    draft.put("job_id", slurm.job_id, slurm.job_var)
    draft.put("master_port", derived_port(slurm.job_id, "batch"), "rule: hash(SLURM_JOB_ID, batch)")
    return draft


def _job_nodes(v: Vars) -> tuple[list[str], str] | None:
    """The job's node list (job scope) and the variable it came from."""
    found = v.first("SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if found is None:
        return None
    return expand_hostlist(found[1], variable=found[0]), found[0]


def _aliased(v: Vars, host: str, draft: Draft, source: str) -> None:
    """Set master_addr to ``host``, or to its address from ``SLURM_NODE_ALIASES`` (cloud nodes)."""
    aliases = v.text("SLURM_NODE_ALIASES")
    if aliases and aliases != "(null)":
        for entry in aliases.split(","):
            name, _, rest = entry.partition(":")
            address = rest.split(":", 1)[0].strip("[]")
            if name == host and address:
                draft.put("master_addr", address, source, "SLURM_NODE_ALIASES")
                return
    draft.put("master_addr", host, source)


def _step_layout(v: Vars) -> tuple[list[int] | None, str | None]:
    found = v.first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if found is None:
        return None, None
    return expand_counts(found[1], variable=found[0]), found[0]


def _gtids(v: Vars) -> list[int] | None:
    text = v.text("SLURM_GTIDS")
    if text is None:
        return None
    ids = [decimal(item) for item in text.split(",")]
    if any(number is None for number in ids):
        raise MalformedEnvError(
            f"SLURM_GTIDS={v.quoted('SLURM_GTIDS')} is not a comma-separated list of task ids.",
            variables=("SLURM_GTIDS",),
            fix="check what set SLURM_GTIDS; srun sets it to the global ranks of this node's tasks.",
        )
    return [number for number in ids if number is not None]


def _inconsistent(draft: Draft, slurm: Slurm, what: str, variables: tuple[str, ...]) -> None:
    """Raise for an inconsistent step, except in heterogeneous jobs (component scopes): note there."""
    if slurm.heterogeneous:
        draft.note(f"heterogeneous job: {what}; the value was not used.")
        return
    raise ConflictingEnvError(
        f"the Slurm step variables contradict each other: {what}.",
        variables=variables,
        why="srun sets these together; a mismatch means some were exported by hand or inherited from "
        "another step or job.",
        fix="do not export SLURM_* variables yourself; launch with srun inside the allocation.",
    )


def task_world(v: Vars, slurm: Slurm) -> Draft:
    """The world of an srun task (srun is the launcher, possibly through --mpi=pmi2/pmix/cray_shasta)."""
    draft, world_var = _step_size(v, slurm)
    gtids = _step_local_rank(v, slurm, draft)
    counts, counts_var, nodes_var = _step_nodes(v, draft)
    if counts is not None and counts_var is not None:
        _check_layout(v, slurm, draft, counts=(counts, counts_var), world_var=world_var, nodes_var=nodes_var)
    _step_local_world(v, slurm, draft, gtids=gtids, counts_var=counts_var, world_var=world_var)
    _step_master(v, slurm, draft)
    draft.put(
        "master_port",
        derived_port(slurm.job_id, slurm.step_id or ""),
        "rule: hash(SLURM_JOB_ID, SLURM_STEP_ID)",
    )
    draft.put("restart_count", v.integer(_RESTART), _RESTART)
    return draft


def _step_size(v: Vars, slurm: Slurm) -> tuple[Draft, str]:
    """Rank and world size of the step's task, and the variable that gave the size."""
    if slurm.procid is None or slurm.step_var is None:
        raise AssertionError("an srun task world needs an srun step")  # guarded by Slurm.in_step
    world = v.first_integer("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", minimum=1)
    if world is None:
        raise IncompleteEnvError(
            f"srun step {slurm.step} does not say how many tasks it has.",
            variables=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
            fix="launch with srun (it sets SLURM_STEP_NUM_TASKS), or export WORLD_SIZE.",
        )
    draft = Draft(launcher="slurm", rank=slurm.procid, world_size=world[1])
    draft.sources.update(rank=("SLURM_PROCID",), world_size=(world[0],))
    draft.put("job_id", slurm.job_id, slurm.job_var)
    stale = v.integer("SLURM_NTASKS", minimum=1)
    if world[0] == "SLURM_STEP_NUM_TASKS" and stale is not None and stale != world[1]:
        draft.note(
            f"SLURM_NTASKS={stale} (allocation) differs from SLURM_STEP_NUM_TASKS={world[1]} (this step); "
            "the step value is used."
        )
    return draft, world[0]


def _step_local_rank(v: Vars, slurm: Slurm, draft: Draft) -> list[int] | None:
    """Local rank from SLURM_LOCALID (else the position in SLURM_GTIDS), checked against SLURM_GTIDS."""
    gtids = _gtids(v)
    local = v.integer("SLURM_LOCALID")
    if local is not None:
        draft.put("local_rank", local, "SLURM_LOCALID")
    elif gtids is not None and slurm.procid in gtids:
        draft.put("local_rank", gtids.index(slurm.procid), "SLURM_GTIDS", "SLURM_PROCID")
    else:
        raise IncompleteEnvError(
            f"srun task {slurm.procid} of step {slurm.step} has no SLURM_LOCALID.",
            variables=("SLURM_LOCALID", "SLURM_GTIDS"),
            fix="launch with srun, which sets SLURM_LOCALID for every task.",
        )
    if gtids is None:
        return None
    if slurm.procid not in gtids:
        raise ConflictingEnvError(
            f"SLURM_PROCID={slurm.procid} is not among this node's tasks SLURM_GTIDS={v.quoted('SLURM_GTIDS')}.",
            variables=("SLURM_PROCID", "SLURM_GTIDS"),
            why="SLURM_PROCID was probably exported or inherited from another step.",
            fix="do not export SLURM_PROCID; launch with srun.",
        )
    if gtids.index(slurm.procid) != draft.local_rank:
        raise ConflictingEnvError(
            f"SLURM_LOCALID={draft.local_rank} but SLURM_PROCID={slurm.procid} is at position "
            f"{gtids.index(slurm.procid)} of SLURM_GTIDS={v.quoted('SLURM_GTIDS')}.",
            variables=("SLURM_LOCALID", "SLURM_PROCID", "SLURM_GTIDS"),
            fix="do not export SLURM_LOCALID or SLURM_PROCID; launch with srun.",
        )
    return gtids


def _step_nodes(v: Vars, draft: Draft) -> tuple[list[int] | None, str | None, str | None]:
    """Node rank and node count; returns the tasks-per-node layout, its variable and the node-count variable."""
    draft.put("node_rank", v.integer("SLURM_NODEID"), "SLURM_NODEID")
    counts, counts_var = _step_layout(v)
    nodes_found = v.first_integer("SLURM_STEP_NUM_NODES", "SLURM_NNODES", minimum=1)
    if nodes_found is not None:
        draft.put("num_nodes", nodes_found[1], nodes_found[0])
    elif counts is not None and counts_var is not None:
        draft.put("num_nodes", len(counts), counts_var)
    return counts, counts_var, None if nodes_found is None else nodes_found[0]


def _check_layout(
    v: Vars, slurm: Slurm, draft: Draft, *, counts: tuple[list[int], str], world_var: str, nodes_var: str | None
) -> None:
    """The tasks-per-node layout must add up to the step and list its nodes; it gives the local world size."""
    layout, name = counts
    if name != "SLURM_STEP_TASKS_PER_NODE":
        draft.note("SLURM_STEP_TASKS_PER_NODE is absent; SLURM_TASKS_PER_NODE was used for the layout.")
    node = draft.node_rank
    if sum(layout) != draft.world_size:
        what = f"{name}={v.quoted(name)} adds up to {sum(layout)} tasks, not {world_var}={draft.world_size}"
        _inconsistent(draft, slurm, what, (name, world_var))
    elif nodes_var is not None and len(layout) != draft.num_nodes:
        what = f"{name}={v.quoted(name)} lists {len(layout)} nodes, not {nodes_var}={draft.num_nodes}"
        _inconsistent(draft, slurm, what, (name, nodes_var))
    elif node is not None and node >= len(layout):
        what = f"SLURM_NODEID={node} but {name}={v.quoted(name)} lists {len(layout)} nodes"
        _inconsistent(draft, slurm, what, ("SLURM_NODEID", name))
    elif node is not None:
        draft.put("local_world_size", layout[node], name, "SLURM_NODEID")


def _step_local_world(
    v: Vars, slurm: Slurm, draft: Draft, *, gtids: list[int] | None, counts_var: str | None, world_var: str
) -> None:
    """Local world size from SLURM_GTIDS when the layout did not give it (they must agree when both do)."""
    if draft.local_world_size is None and gtids is not None:
        draft.put("local_world_size", len(gtids), "SLURM_GTIDS")
    elif gtids is not None and draft.local_world_size != len(gtids):
        _inconsistent(
            draft,
            slurm,
            f"SLURM_GTIDS={v.quoted('SLURM_GTIDS')} lists {len(gtids)} tasks on this node but the layout says "
            f"{draft.local_world_size}",
            ("SLURM_GTIDS", counts_var or "SLURM_STEP_TASKS_PER_NODE"),
        )
    if draft.local_world_size is None and draft.world_size == 1:
        draft.put("local_world_size", 1, world_var)


def _step_master(v: Vars, slurm: Slurm, draft: Draft) -> None:
    """Rank 0's host: the first node of the step (block, cyclic and plane distributions)."""
    found = v.first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if found is None:
        return
    hosts = expand_hostlist(found[1], variable=found[0])
    if not hosts:
        raise MalformedEnvError(f"{found[0]}={v.quoted(found[0])} lists no hosts.", variables=(found[0],))
    if found[0] != "SLURM_STEP_NODELIST":
        draft.note(f"SLURM_STEP_NODELIST is absent; {found[0]} (job scope) was used to find rank 0's host.")
    elif draft.num_nodes is not None and len(hosts) != draft.num_nodes:
        _inconsistent(
            draft,
            slurm,
            f"SLURM_STEP_NODELIST={v.quoted(found[0])} has {len(hosts)} hosts but the step has {draft.num_nodes} nodes",
            ("SLURM_STEP_NODELIST", *draft.sources.get("num_nodes", ())),
        )
        return
    node = draft.node_rank
    if node is not None and node >= len(hosts):
        # SLURM_NODEID counts the step's nodes, and they are among the job's: either list bounds it.
        what = f"SLURM_NODEID={node} but {found[0]}={v.quoted(found[0])} lists {len(hosts)} nodes"
        _inconsistent(draft, slurm, what, ("SLURM_NODEID", found[0]))
    if found[0] == "SLURM_STEP_NODELIST" and not slurm.heterogeneous:
        _check_node_name(v, hosts, node)
    distribution = (v.raw("SLURM_DISTRIBUTION") or "").strip().lower()
    if distribution.startswith("arbitrary") and len(set(hosts)) > 1:
        draft.note(
            "SLURM_DISTRIBUTION=arbitrary: rank 0 runs where SLURM_HOSTFILE says, not necessarily on the first "
            "node; MASTER_ADDR is unknown. Export MASTER_ADDR to rank 0's host."
        )
        return
    _aliased(v, hosts[0], draft, found[0])


def _check_node_name(v: Vars, hosts: list[str], node: int | None) -> None:
    """This node's name (SLURMD_NODENAME) must sit at index SLURM_NODEID of the step's node list."""
    name = v.text("SLURMD_NODENAME")
    if name is None or name not in hosts or node is None or node >= len(hosts) or hosts[node] == name:
        return
    raise ConflictingEnvError(
        f"SLURMD_NODENAME={v.quoted('SLURMD_NODENAME')} is node {hosts.index(name)} of SLURM_STEP_NODELIST="
        f"{v.quoted('SLURM_STEP_NODELIST')}, but SLURM_NODEID={node}.",
        variables=("SLURMD_NODENAME", "SLURM_NODEID", "SLURM_STEP_NODELIST"),
        why="SLURM_NODEID was probably exported or inherited from another step.",
        fix="do not export SLURM_NODEID; launch with srun.",
    )


def plugin_world(v: Vars, slurm: Slurm, mpi: MpiWorld) -> Draft:
    """An srun step launched through its own MPI plugin (``--mpi=pmi2/pmix/cray_shasta``).

    srun is the launcher; the PMI/PMIx/PALS variables it exports must agree with the step's.

    Raises:
        ConflictingEnvError: an MPI plugin variable disagrees with the step's value.
    """
    draft = task_world(v, slurm)
    for field, target in (("rank", "rank"), ("size", "world_size"), ("local_rank", "local_rank")):
        value = mpi.get(field)
        if value is not None and value != getattr(draft, target):
            source = draft.sources[target][0]
            raise ConflictingEnvError(
                f"{mpi.source(field)}={value} disagrees with {source}={getattr(draft, target)} in srun step "
                f"{slurm.step}.",
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
    return draft


def exported_in_step(v: Vars, slurm: Slurm, exported: Draft, *, here: str) -> Draft:
    """Exported RANK/WORLD_SIZE inside an srun step: they must describe the step's own tasks.

    Raises:
        ConflictingEnvError: they disagree with a step of more than one task.
    """
    draft = task_world(v, slurm)
    if exported.rank == draft.rank and exported.world_size == draft.world_size:
        draft.note("RANK and WORLD_SIZE are also exported and agree with the srun step.")
        _explicit.check_agreement(v, draft, here=here)
        return draft
    if draft.world_size == 1 and (draft.num_nodes or 1) == 1:
        # A one-task step running its own per-node spawner that exports RANK for its children.
        exported.note(
            f"RANK/WORLD_SIZE were exported inside a one-task srun step ({slurm.step}): "
            "a process spawner inside the step is assumed to have set them."
        )
        exported.put("job_id", slurm.job_id, slurm.job_var)
        _explicit.fill_locals(v, exported)
        _explicit.settle_node_rank(exported)
        _explicit.default_port(v, exported)
        return exported
    variables = (
        ("RANK", "SLURM_PROCID") if exported.rank != draft.rank else ("WORLD_SIZE", draft.sources["world_size"][0])
    )
    raise ConflictingEnvError(
        f"RANK={exported.rank}, WORLD_SIZE={exported.world_size} (exported) disagree with the srun step: "
        f"SLURM_PROCID={draft.rank} of {draft.sources['world_size'][0]}={draft.world_size}{here}.",
        variables=variables,
        why="an `export RANK=...`/`WORLD_SIZE=...` in the job script is inherited by every task srun starts, "
        "or the values were computed as NODE_RANK * n + LOCAL_RANK.",
        fix="remove RANK and WORLD_SIZE from the job script (distinit reads the srun step), or start one torchrun "
        "per node (torchrun sets TORCHELASTIC_RUN_ID and its own RANK).",
    )


def daemon_step_facts(v: Vars, slurm: Slurm, draft: Draft, *, launch_id: str | None) -> None:
    """Fill what the Slurm job says about an MPI world whose ranks were started by mpirun/hydra.

    Inside an allocation, mpirun/hydra start one daemon per node with srun (the "daemon step"), and
    the ranks inherit that step's variables: ``SLURM_PROCID`` is the daemon's index, not a rank.
    ``SLURM_NODEID`` is a node index for every rank only if the daemon step runs one task on each node
    of the job; ranks on mpirun's own node in a batch script see no step at all. Rank 0's host follows
    from the launcher's default mapping and where the launcher runs (:func:`_daemon_master`), noted.
    ``launch_id`` (the MPI launch's id) keeps the ports of two mpiruns in one job apart.
    """
    draft.put("job_id", slurm.job_id, slurm.job_var)
    job = _job_nodes(v)
    if slurm.in_step:
        _daemon_node_rank(v, slurm, draft, job_hosts=None if job is None else job[0])
    on_one_node = draft.local_world_size is not None and draft.local_world_size == draft.world_size
    if job is not None and job[0] and draft.master_addr is None and not on_one_node:
        _daemon_master(v, slurm, draft, job=job)
    draft.put(
        "master_port",
        derived_port(slurm.job_id, "mpi", launch_id or ""),
        f"rule: hash({slurm.job_var}, {'MPI launch id' if launch_id else 'mpi'})",
    )


def _daemon_master(v: Vars, slurm: Slurm, draft: Draft, *, job: tuple[list[str], str]) -> None:
    """Rank 0's host: the first node that runs ranks under mpirun's/hydra's default mapping (noted).

    Which node that is depends on where the launcher itself runs. From a salloc shell outside the
    allocation its daemon step covers the job: the job's first node. From a batch script it runs
    ranks on its own node and starts daemons on the others: the one job node outside the step. With
    ``--host`` naming a subset it starts daemons only there: the step's first node. Open MPI's node
    count (the nodes running ranks) tells the last two apart; without it the master stays unknown.
    """
    hosts, job_var = job
    step_text = v.text("SLURM_STEP_NODELIST") if slurm.in_step else None
    step = None if step_text is None else expand_hostlist(step_text, variable="SLURM_STEP_NODELIST")
    nodes = draft.num_nodes
    outside = [host for host in hosts if step is not None and host not in step]
    if step is None or step == hosts:
        first, source, where = hosts[0], job_var, "the first node of the job"
    elif step and nodes == len(step):
        first, source = step[0], "SLURM_STEP_NODELIST"
        where = "the first node of its daemon step (every node it runs ranks on has a daemon)"
    elif nodes == len(step) + 1 and len(outside) == 1:
        first, source, where = outside[0], job_var, "its own node, the one job node without a daemon"
    else:
        draft.note(
            f"MASTER_ADDR is unknown: {draft.launcher}'s daemon step ({clipped(step_text or '')}) covers part of the "
            f"job's nodes and {'no node count says' if nodes is None else f'{nodes} nodes do not say'} which of them "
            f"holds rank 0. Pass it: {master_addr_fix(draft.launcher)}"
        )
        return
    _aliased(v, first, draft, source)
    draft.note(
        f"MASTER_ADDR={first} by rule: {draft.launcher}'s default mapping places rank 0 on {where}; export "
        "MASTER_ADDR if you map ranks otherwise."
    )


def _daemon_node_rank(v: Vars, slurm: Slurm, draft: Draft, *, job_hosts: list[str] | None) -> None:
    """SLURM_NODEID is the node rank when the daemon step runs one task on every node of the job."""
    counts, _ = _step_layout(v)
    step_nodes = v.first("SLURM_STEP_NODELIST")
    node = v.integer("SLURM_NODEID")
    covers_job = (
        job_hosts is not None
        and step_nodes is not None
        and expand_hostlist(step_nodes[1], variable="SLURM_STEP_NODELIST") == job_hosts
    )
    if counts is not None and all(count == 1 for count in counts) and covers_job and node is not None:
        draft.put("node_rank", node, "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST")
        draft.put("num_nodes", len(counts), "SLURM_STEP_TASKS_PER_NODE")
        draft.trusted_node_rank = True
        draft.note(
            f"SLURM_PROCID={slurm.procid} belongs to {draft.launcher}'s launcher daemons (one per node), not to "
            "this rank; SLURM_NODEID is used as the node rank."
        )
    else:
        draft.note(
            f"SLURM_PROCID={slurm.procid} belongs to {draft.launcher}'s launcher daemons, not to this rank; it "
            "is ignored."
        )
