"""``env_from_scheduler``: the one call that turns launcher variables into a torch world."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from distinit.env._model import DistEnv
from distinit.env._resolve import resolve, where

logger = logging.getLogger("distinit.env")


def env_from_scheduler(
    environ: Mapping[str, str] | None = None, *, strict: bool = True, export: bool = False
) -> DistEnv:
    """Resolve the torch world of this process from launcher and scheduler variables.

    Reads Slurm, Open MPI, MPICH/Intel hydra, MVAPICH2, Cray PALS, LSF jsrun, Horovod, torchrun,
    the DeepSpeed launcher, Kubeflow, Azure ML, SageMaker and Vertex AI variables. The innermost
    launcher wins (torchrun > MPI > exported RANK/WORLD_SIZE > srun step > cloud platform), every
    other source present is cross-checked against it, and ``RANK`` is never computed from
    ``NODE_RANK``. Unknown values stay ``None`` instead of being guessed; assumptions are listed in
    ``notes`` and the origin of every value in ``sources``.

    Args:
        environ: the variables to read; ``os.environ`` when ``None``. The function is pure: with a
            mapping it has no side effects at all.
        strict: when True, a process that is visibly part of a job but was not started by its
            launcher (an sbatch script or salloc shell of a multi-task allocation, a Kubeflow pod
            expecting torchrun) raises ``NotLaunchedError``. When False it becomes a single-process
            world with a note. Without any launcher variables the world is a single process either way.
        export: also write the torch variables into ``os.environ`` (see ``DistEnv.export``).

    Returns:
        The validated world of this process.

    Raises:
        NotLaunchedError: strict mode and the process was not started by the job's launcher.
        IncompleteEnvError: a launcher was detected but a variable it must set is missing.
        ConflictingEnvError: two sources disagree, or the values describe an impossible world.
        MalformedEnvError: a value does not parse (integer, port, hostlist, JSON host list).
    """
    own = environ is None
    env = resolve(os.environ if environ is None else environ, strict=strict, here=where() if own else "")
    logger.debug(
        "resolved rank %d of %d (local %d, node %s) from %s",
        env.rank,
        env.world_size,
        env.local_rank,
        env.node_rank,
        env.launcher,
        extra={
            "distinit": {
                "event": "env.resolved",
                **env.model_dump(include={"rank", "world_size", "launcher"}),
            }
        },
    )
    for note in env.notes:
        logger.debug("rank %d: %s", env.rank, note, extra={"distinit": {"event": "env.note", "note": note}})
    if export:
        env.export()
    return env
