"""The one backend choice: which backend a rank uses when the caller names none."""

from __future__ import annotations

import os

import torch

from distinit.errors import ConflictingEnvError


def choose_backend(
    backend: str | None,
    *,
    local_rank: int,
    local_world_size: int | None = None,
    device_id: int | torch.device | None = None,
) -> str:
    """``backend`` if given; else NCCL when ``device_id`` is given or CUDA is available; else gloo.

    :func:`distinit.setup` binds the GPU exactly when this returns ``"nccl"``, so both agree by construction.

    Raises:
        ConflictingEnvError: no backend named, CUDA available, and this host has more ranks
            (``local_world_size``, or at least ``local_rank + 1``) than visible devices. Choosing per rank
            would give NCCL to the ranks with a device and gloo to the others, and a group of mixed
            backends never forms (each side waits for the other until the timeout); every rank of the
            host computes the same facts, so every one raises the same error at once.
    """
    if backend is not None:
        return backend
    if device_id is not None:
        return "nccl"
    if not torch.cuda.is_available():
        return "gloo"
    count = torch.cuda.device_count()
    here = max(local_rank + 1, local_world_size or 0)
    if here > count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConflictingEnvError(
            f"{here} ranks on this host (LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world_size}) but "
            f"{count} CUDA device(s) visible (CUDA_VISIBLE_DEVICES={visible!r}), and no backend named: local ranks "
            f"below {count} would choose NCCL and the others gloo, and a group of mixed backends never forms",
            variables=("LOCAL_WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"),
            why="the launcher starts more ranks per host than this host has GPUs, or binds each task to GPUs of "
            "its own (Slurm --gpus-per-task): setup() binds cuda:LOCAL_RANK, so it needs every GPU of the host "
            "visible to every rank",
            fix=f"launch at most {count} rank(s) per host (torchrun --nproc-per-node={count}), or name the "
            "backend for a CPU job: setup('gloo') / init_with_retry('gloo')",
        )
    return "nccl"
