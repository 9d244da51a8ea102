"""torchrun / torchelastic workers: detected by ``TORCHELASTIC_RUN_ID``.

torchrun is always the innermost launcher when present: the ``SLURM_*`` or ``OMPI_*`` variables
around it describe the agent that ran torchrun, not the worker. Its node rank is ``GROUP_RANK``,
which with c10d rendezvous is the agents' arrival order, not Slurm's node order. It says how many
workers it started (``LOCAL_WORLD_SIZE`` per agent, ``GROUP_WORLD_SIZE`` agents), and whether its agent
hosts the store the workers meet at (``TORCHELASTIC_USE_AGENT_STORE=True``: rank 0 connects, it does not host).
"""

from __future__ import annotations

from distinit.env._draft import Draft, Vars

_FIX = (
    "start workers with torchrun itself (it sets RANK, LOCAL_RANK, WORLD_SIZE, ...); if TORCHELASTIC_RUN_ID "
    "leaked from a parent torchrun into another launcher, unset it"
)


def read(v: Vars) -> Draft | None:
    """The world of a torchrun worker, or ``None`` when torchrun did not start this process."""
    if not v.has("TORCHELASTIC_RUN_ID"):
        return None
    rank = v.require_integer("RANK", launcher="torchrun", fix=_FIX)
    world_size = v.require_integer("WORLD_SIZE", launcher="torchrun", minimum=1, fix=_FIX)
    local_rank = v.require_integer("LOCAL_RANK", launcher="torchrun", fix=_FIX)
    draft = Draft(launcher="torchrun", rank=rank, world_size=world_size)
    draft.sources.update(rank=("RANK",), world_size=("WORLD_SIZE",))
    draft.put("local_rank", local_rank, "LOCAL_RANK")
    draft.put("local_world_size", v.integer("LOCAL_WORLD_SIZE", minimum=1), "LOCAL_WORLD_SIZE")
    draft.put("node_rank", v.integer("GROUP_RANK"), "GROUP_RANK")
    draft.put("num_nodes", v.integer("GROUP_WORLD_SIZE", minimum=1), "GROUP_WORLD_SIZE")
    draft.put("restart_count", v.integer("TORCHELASTIC_RESTART_COUNT"), "TORCHELASTIC_RESTART_COUNT")
    per_node, nodes = v.first_count("LOCAL_WORLD_SIZE"), v.first_count("GROUP_WORLD_SIZE")
    if per_node is not None and nodes is not None:
        draft.put("launched", per_node[1] * nodes[1], "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE")
    # torch's own test (torch.distributed.elastic): the agent's store serves the workers' rendezvous.
    if v.raw("TORCHELASTIC_USE_AGENT_STORE") == "True":
        draft.put("agent_store", True, "TORCHELASTIC_USE_AGENT_STORE")
    run_id = v.raw("TORCHELASTIC_RUN_ID")
    if run_id and run_id.strip() and run_id.strip() != "none":
        draft.put("job_id", run_id.strip(), "TORCHELASTIC_RUN_ID")
    else:
        outer = v.first("SLURM_JOB_ID", "SLURM_JOBID", "LSB_JOBID", "PBS_JOBID")
        if outer is not None:
            draft.put("job_id", outer[1], outer[0])

    exported = v.integer("NODE_RANK")
    if exported is not None and draft.node_rank is not None and exported != draft.node_rank:
        draft.note(
            f"NODE_RANK={exported} (exported) differs from torchrun's GROUP_RANK={draft.node_rank}; torchrun "
            "assigns node ranks at rendezvous, so GROUP_RANK is used and export() overwrites NODE_RANK."
        )
    slurm_node = v.integer("SLURM_NODEID")
    if slurm_node is not None and draft.node_rank is not None and slurm_node != draft.node_rank:
        draft.note(
            f"torchrun's GROUP_RANK={draft.node_rank} differs from SLURM_NODEID={slurm_node}: the c10d "
            "rendezvous orders agents by arrival, not by Slurm's node list. NODE_RANK follows torchrun."
        )
    return draft
