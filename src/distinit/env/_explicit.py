"""Explicit torch variables (``RANK``/``WORLD_SIZE``...) set by a launcher that is not torchrun.

The DeepSpeed launcher, Kubeflow's legacy PyTorchJob, Azure ML's PyTorch distribution and users'
own job scripts export the torch names directly. The names are the same, so the launcher is told
apart by its other variables (``CROSS_RANK``, ``KUBERNETES_SERVICE_HOST``, ``AZUREML_*``). When another
launcher is the source of the world, :func:`check_agreement` holds the exported names against it.
"""

from __future__ import annotations

from distinit._port import derived_port
from distinit.env._draft import Draft, Vars
from distinit.errors import ConflictingEnvError, IncompleteEnvError

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")

#: The exported torch variables checked against a launcher that is not itself their source.
_CHECKED = (
    ("RANK", "rank"),
    ("WORLD_SIZE", "world_size"),
    ("LOCAL_RANK", "local_rank"),
    ("LOCAL_WORLD_SIZE", "local_world_size"),
)


def read(v: Vars) -> Draft | None:
    """The world given by explicit ``RANK`` and ``WORLD_SIZE``; ``None`` when neither is set.

    Raises:
        IncompleteEnvError: only one of RANK and WORLD_SIZE is set (WORLD_SIZE=1 alone is allowed).
    """
    rank = v.integer("RANK")
    world_size = v.integer("WORLD_SIZE", minimum=1)
    if rank is None and world_size is None:
        return None
    if rank is None:
        if world_size == 1:
            rank_source = "rule: WORLD_SIZE=1"
            rank = 0
        else:
            raise IncompleteEnvError(
                f"WORLD_SIZE={world_size} is set but RANK is not.",
                variables=("RANK", "WORLD_SIZE"),
                fix="export RANK for every process, or start them with a launcher (torchrun, srun, mpirun).",
            )
    else:
        rank_source = "RANK"
    if world_size is None:
        raise IncompleteEnvError(
            f"RANK={rank} is set but WORLD_SIZE is not.",
            variables=("RANK", "WORLD_SIZE"),
            fix="export WORLD_SIZE too, or start the processes with a launcher (torchrun, srun, mpirun).",
        )
    draft = Draft(launcher="env", rank=rank, world_size=world_size)
    draft.sources.update(rank=(rank_source,), world_size=("WORLD_SIZE",))
    draft.put("local_rank", v.integer("LOCAL_RANK"), "LOCAL_RANK")
    lws = v.first_integer("LOCAL_WORLD_SIZE", "LOCAL_SIZE", minimum=1)
    if lws is not None:
        draft.put("local_world_size", lws[1], lws[0])
    node = v.first_integer("NODE_RANK", "GROUP_RANK", "CROSS_RANK")
    if node is not None:
        draft.put("node_rank", node[1], node[0])
    nodes = v.first_integer("NUM_NODES", "GROUP_WORLD_SIZE", "CROSS_SIZE", minimum=1)
    if nodes is not None:
        draft.put("num_nodes", nodes[1], nodes[0])

    if v.has("CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE"):
        draft.launcher = "deepspeed"
    elif v.has("AZUREML_RUN_ID", "AZUREML_EXPERIMENT_ID"):
        draft.launcher = "azureml"
    elif v.has("CLUSTER_SPEC"):
        draft.launcher = "vertex"
    elif v.has("SM_HOSTS", "SM_TRAINING_ENV"):
        draft.launcher = "sagemaker"
    elif v.has("KUBERNETES_SERVICE_HOST") and v.has("MASTER_ADDR"):
        draft.launcher = "kubeflow"
    return draft


def fill_locals(v: Vars, draft: Draft) -> None:
    """Local rank and node rank where the launcher leaves them out, with the assumption noted.

    Called only once the explicit variables are chosen as the source of the world: inside an srun
    step the step supplies the local values instead.

    Raises:
        IncompleteEnvError: several processes on several hosts and no way to know the local rank.
    """
    if draft.launcher in ("kubeflow", "vertex", "sagemaker") and draft.local_rank is None:
        draft.put("local_rank", 0, "rule: one process per pod")
        draft.put("local_world_size", 1, "rule: one process per pod")
        if draft.node_rank is None:
            draft.put("node_rank", draft.rank, "RANK", "rule: one process per pod")
            draft.put("num_nodes", draft.world_size, "WORLD_SIZE", "rule: one process per pod")
            draft.trusted_node_rank = False
        ruled = (
            " and node_rank = RANK" if draft.sources.get("node_rank", ("",))[-1] == "rule: one process per pod" else ""
        )
        draft.note(f"{draft.launcher}: LOCAL_RANK is not set, so one process per pod (or host) is assumed{ruled}.")
        return
    if draft.local_rank is not None:
        return
    if draft.world_size == 1:
        draft.put("local_rank", 0, "rule: WORLD_SIZE=1")
        draft.put("local_world_size", 1, "rule: WORLD_SIZE=1")
        return
    master = (v.text("MASTER_ADDR") or "").lower()
    if master in _LOOPBACK:
        draft.put("local_rank", draft.rank, "RANK", "rule: MASTER_ADDR is this host")
        draft.put("local_world_size", draft.world_size, "WORLD_SIZE", "rule: MASTER_ADDR is this host")
        draft.note(
            f"LOCAL_RANK is not set; MASTER_ADDR={master!r} is a loopback address, so the whole world is assumed "
            "to run on this host and LOCAL_RANK = RANK."
        )
        return
    raise IncompleteEnvError(
        f"RANK={draft.rank} and WORLD_SIZE={draft.world_size} are set but LOCAL_RANK is not.",
        variables=("LOCAL_RANK",),
        why="without the local rank, processes on one node cannot pick distinct GPUs.",
        fix="export LOCAL_RANK (and LOCAL_WORLD_SIZE) for every process, or start them with torchrun, srun or mpirun.",
    )


def settle_node_rank(draft: Draft) -> None:
    """Node 0 of 1 when the whole world is on this node; otherwise an unknown node rank is noted.

    Called once the exported variables are the world: without ``NODE_RANK`` nothing says which node
    this is, and ``export()`` leaves ``NODE_RANK`` unset (frameworks then take node 0).
    """
    if draft.node_rank is not None:
        return
    if draft.local_world_size is not None and draft.local_world_size == draft.world_size:
        draft.put("node_rank", 0, "rule: whole world on this node")
        draft.put("num_nodes", 1, "rule: whole world on this node")
        return
    draft.note(
        "node_rank is unknown: RANK/LOCAL_RANK/WORLD_SIZE are exported without NODE_RANK (or GROUP_RANK), so "
        "export() leaves NODE_RANK unset and frameworks that need it take node 0 (Lightning computes GLOBAL_RANK "
        "= NODE_RANK * devices + LOCAL_RANK). Export NODE_RANK on each node, or let distinit.setup() derive it "
        "from the world once the group forms."
    )


def default_port(v: Vars, draft: Draft) -> None:
    """A port derived from the job id when the exported world has a job but no MASTER_PORT."""
    if draft.master_port is None and draft.job_id is not None and not v.has("MASTER_PORT"):
        draft.put("master_port", derived_port(draft.job_id, "env"), "rule: hash(job id)")


def check_agreement(v: Vars, draft: Draft, *, here: str) -> None:
    """Exported torch variables must agree with the launcher's values; NODE_RANK fills an assumption.

    Raises:
        ConflictingEnvError: an exported value differs from the launcher's, or NODE_RANK/GROUP_RANK
            is not below a node count the launcher gives.
    """
    launcher = draft.launcher
    for name, field in _CHECKED:
        exported = v.integer(name, minimum=1 if name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") else 0)
        value = getattr(draft, field)
        if exported is None or value is None or exported == value:
            continue
        source = draft.sources.get(field, ("the launcher",))[0]
        raise ConflictingEnvError(
            f"{name}={v.quoted(name)} (exported) disagrees with {source}={value!r} ({launcher}, the innermost "
            f"launcher){here}.",
            variables=(name, source),
            why=f"an `export {name}=...` in the job script is inherited by every process the launcher starts, so "
            "several processes claim the same value.",
            fix=f"remove {name} from the job script (distinit reads {launcher}'s variables), or launch with torchrun.",
        )
    _node_rank_agreement(v, draft, here=here)


def _node_rank_agreement(v: Vars, draft: Draft, *, here: str) -> None:
    """An exported NODE_RANK/GROUP_RANK replaces an assumed node rank and must equal a known one."""
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
            f"{name}={exported} (exported) disagrees with {source}={draft.node_rank} ({draft.launcher}){here}.",
            variables=(name, source),
            why=f"an `export {name}=...` in the job script is inherited by every node, so several nodes claim the "
            "same node rank.",
            fix=f"remove {name} from the job script; distinit takes the node rank from {source}.",
        )
