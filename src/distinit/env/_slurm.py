"""Slurm: srun steps, batch scripts, salloc shells, and the daemon steps of mpirun/hydra.

Slurm has two scopes. Inside an srun step, ``SLURM_NODELIST``/``SLURM_JOB_NODELIST`` and
``SLURM_NTASKS_PER_NODE`` still describe the whole *job*, so a step on a subset of nodes gets a
wrong master from them. The step-scope variables (``SLURM_STEP_NODELIST``, ``SLURM_STEP_NUM_TASKS``,
``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_GTIDS``) are the truth, and only ``SLURM_STEP_ID`` (legacy
``SLURM_STEPID``) tells an srun task from a batch script that merely looks like rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from distinit.env._draft import Draft, Vars, hashed_port
from distinit.env._hostlist import expand_counts, expand_hostlist
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
    def in_step(self) -> bool:
        """Whether this process is a task of an srun step (not the batch script or a salloc shell)."""
        return self.step_id is not None and self.procid is not None


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


def allocation_tasks(v: Vars) -> tuple[int, tuple[str, ...]]:
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


def job_nodes(v: Vars) -> tuple[list[str], str] | None:
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
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise MalformedEnvError(
            f"SLURM_GTIDS={text!r} is not a comma-separated list of task ids.",
            variables=("SLURM_GTIDS",),
            fix="check what set SLURM_GTIDS; srun sets it to the global ranks of this node's tasks.",
        ) from None


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


def launching_step(v: Vars, slurm: Slurm) -> Draft:
    """The world of an srun task (srun is the launcher, possibly through --mpi=pmi2/pmix/cray_shasta)."""
    if slurm.procid is None or slurm.step_var is None:
        raise AssertionError("launching_step needs an srun step")  # guarded by Slurm.in_step
    world = v.first_integer("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", minimum=1)
    if world is None:
        raise IncompleteEnvError(
            f"srun step {slurm.job_id}.{slurm.step_id} does not say how many tasks it has.",
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

    gtids = _gtids(v)
    local = v.integer("SLURM_LOCALID")
    if local is not None:
        draft.put("local_rank", local, "SLURM_LOCALID")
    elif gtids is not None and slurm.procid in gtids:
        draft.put("local_rank", gtids.index(slurm.procid), "SLURM_GTIDS", "SLURM_PROCID")
    else:
        raise IncompleteEnvError(
            f"srun task {slurm.procid} of step {slurm.job_id}.{slurm.step_id} has no SLURM_LOCALID.",
            variables=("SLURM_LOCALID", "SLURM_GTIDS"),
            fix="launch with srun, which sets SLURM_LOCALID for every task.",
        )
    if gtids is not None:
        if slurm.procid not in gtids:
            raise ConflictingEnvError(
                f"SLURM_PROCID={slurm.procid} is not among this node's tasks SLURM_GTIDS={v.raw('SLURM_GTIDS')!r}.",
                variables=("SLURM_PROCID", "SLURM_GTIDS"),
                why="SLURM_PROCID was probably exported or inherited from another step.",
                fix="do not export SLURM_PROCID; launch with srun.",
            )
        if gtids.index(slurm.procid) != draft.local_rank:
            raise ConflictingEnvError(
                f"SLURM_LOCALID={draft.local_rank} but SLURM_PROCID={slurm.procid} is at position "
                f"{gtids.index(slurm.procid)} of SLURM_GTIDS={v.raw('SLURM_GTIDS')!r}.",
                variables=("SLURM_LOCALID", "SLURM_PROCID", "SLURM_GTIDS"),
                fix="do not export SLURM_LOCALID or SLURM_PROCID; launch with srun.",
            )

    node = v.integer("SLURM_NODEID")
    draft.put("node_rank", node, "SLURM_NODEID")
    counts, counts_var = _step_layout(v)
    nodes_found = v.first_integer("SLURM_STEP_NUM_NODES", "SLURM_NNODES", minimum=1)
    if nodes_found is not None:
        draft.put("num_nodes", nodes_found[1], nodes_found[0])
    elif counts is not None and counts_var is not None:
        draft.put("num_nodes", len(counts), counts_var)

    if counts is not None and counts_var is not None:
        if counts_var != "SLURM_STEP_TASKS_PER_NODE":
            draft.note("SLURM_STEP_TASKS_PER_NODE is absent; SLURM_TASKS_PER_NODE was used for the layout.")
        if sum(counts) != draft.world_size:
            _inconsistent(
                draft,
                slurm,
                f"{counts_var}={v.raw(counts_var)!r} adds up to {sum(counts)} tasks, not {world[0]}={draft.world_size}",
                (counts_var, world[0]),
            )
        elif draft.num_nodes is not None and len(counts) != draft.num_nodes and nodes_found is not None:
            _inconsistent(
                draft,
                slurm,
                f"{counts_var}={v.raw(counts_var)!r} lists {len(counts)} nodes, not {nodes_found[0]}={draft.num_nodes}",
                (counts_var, nodes_found[0]),
            )
        elif node is not None and node >= len(counts):
            _inconsistent(
                draft,
                slurm,
                f"SLURM_NODEID={node} but {counts_var}={v.raw(counts_var)!r} lists {len(counts)} nodes",
                ("SLURM_NODEID", counts_var),
            )
        elif node is not None:
            draft.put("local_world_size", counts[node], counts_var, "SLURM_NODEID")
    if draft.local_world_size is None and gtids is not None:
        draft.put("local_world_size", len(gtids), "SLURM_GTIDS")
    elif gtids is not None and draft.local_world_size != len(gtids):
        _inconsistent(
            draft,
            slurm,
            f"SLURM_GTIDS={v.raw('SLURM_GTIDS')!r} lists {len(gtids)} tasks on this node but the layout says "
            f"{draft.local_world_size}",
            ("SLURM_GTIDS", counts_var or "SLURM_STEP_TASKS_PER_NODE"),
        )
    if draft.local_world_size is None and draft.world_size == 1:
        draft.put("local_world_size", 1, world[0])

    _step_master(v, slurm, draft)
    draft.put(
        "master_port",
        hashed_port(slurm.job_id, slurm.step_id or ""),
        "rule: hash(SLURM_JOB_ID, SLURM_STEP_ID)",
    )
    draft.put("restart_count", v.integer(_RESTART), _RESTART)
    return draft


def _step_master(v: Vars, slurm: Slurm, draft: Draft) -> None:
    """Rank 0's host: the first node of the step (block, cyclic and plane distributions)."""
    found = v.first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if found is None:
        return
    hosts = expand_hostlist(found[1], variable=found[0])
    if not hosts:
        raise MalformedEnvError(f"{found[0]}={v.raw(found[0])!r} lists no hosts.", variables=(found[0],))
    if found[0] != "SLURM_STEP_NODELIST":
        draft.note(f"SLURM_STEP_NODELIST is absent; {found[0]} (job scope) was used to find rank 0's host.")
    elif draft.num_nodes is not None and len(hosts) != draft.num_nodes:
        _inconsistent(
            draft,
            slurm,
            f"SLURM_STEP_NODELIST={v.raw(found[0])!r} has {len(hosts)} hosts but the step has {draft.num_nodes} nodes",
            ("SLURM_STEP_NODELIST", *draft.sources.get("num_nodes", ())),
        )
        return
    name = v.text("SLURMD_NODENAME")
    node = draft.node_rank
    step_scope = found[0] == "SLURM_STEP_NODELIST" and not slurm.heterogeneous
    misplaced = name is not None and name in hosts and node is not None and node < len(hosts) and hosts[node] != name
    if step_scope and misplaced and name is not None:
        raise ConflictingEnvError(
            f"SLURMD_NODENAME={name!r} is node {hosts.index(name)} of SLURM_STEP_NODELIST="
            f"{v.raw('SLURM_STEP_NODELIST')!r}, but SLURM_NODEID={node}.",
            variables=("SLURMD_NODENAME", "SLURM_NODEID", "SLURM_STEP_NODELIST"),
            why="SLURM_NODEID was probably exported or inherited from another step.",
            fix="do not export SLURM_NODEID; launch with srun.",
        )
    distribution = (v.raw("SLURM_DISTRIBUTION") or "").strip().lower()
    if distribution.startswith("arbitrary") and len(set(hosts)) > 1:
        draft.note(
            "SLURM_DISTRIBUTION=arbitrary: rank 0 runs where SLURM_HOSTFILE says, not necessarily on the first "
            "node; MASTER_ADDR is unknown. Export MASTER_ADDR to rank 0's host."
        )
        return
    _aliased(v, hosts[0], draft, found[0])


def daemon_step_facts(v: Vars, slurm: Slurm, draft: Draft) -> None:
    """Fill what the Slurm job says about an MPI world whose ranks were started by mpirun/hydra.

    Inside an allocation, mpirun/hydra start one daemon per node with srun (the "daemon step"), and
    the ranks inherit that step's variables: ``SLURM_PROCID`` is the daemon's index, not a rank.
    ``SLURM_NODEID`` is a node index for every rank only if the daemon step runs one task on each node
    of the job; ranks on mpirun's own node in a batch script see no step at all. Rank 0 runs on the
    first node of the job under mpirun's and hydra's default mapping: that is an assumption, noted.
    """
    draft.put("job_id", slurm.job_id, slurm.job_var)
    job = job_nodes(v)
    if slurm.in_step:
        counts, _ = _step_layout(v)
        step_nodes = v.first("SLURM_STEP_NODELIST")
        node = v.integer("SLURM_NODEID")
        covers_job = (
            job is not None
            and step_nodes is not None
            and expand_hostlist(step_nodes[1], variable="SLURM_STEP_NODELIST") == job[0]
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
    on_one_node = draft.local_world_size is not None and draft.local_world_size == draft.world_size
    if job is not None and job[0] and draft.master_addr is None and not on_one_node:
        _aliased(v, job[0][0], draft, job[1])
        draft.note(
            f"MASTER_ADDR is the first node of the job ({job[0][0]}), assuming {draft.launcher} placed rank 0 there "
            "(its default mapping); export MASTER_ADDR if you map ranks otherwise."
        )
