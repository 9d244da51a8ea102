"""Explicit torch variables (``RANK``/``WORLD_SIZE``...) set by a launcher that is not torchrun.

The DeepSpeed launcher, Kubeflow's legacy PyTorchJob, Azure ML's PyTorch distribution and users'
own job scripts export the torch names directly. The names are the same, so the launcher is told
apart by its other variables (``CROSS_RANK``, ``KUBERNETES_SERVICE_HOST``, ``AZUREML_*``).
"""

from __future__ import annotations

from distinit.env._draft import Draft, Vars
from distinit.errors import IncompleteEnvError

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


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
        draft.note(f"{draft.launcher}: LOCAL_RANK is not set, so one process per pod (or host) is assumed.")
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
