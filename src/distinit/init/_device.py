"""The one backend and device choice of a rank: which backend it uses and which GPU it binds.

:func:`plan_device` is pure: it decides from what one rank sees (how many CUDA devices, its
``CUDA_VISIBLE_DEVICES``, its ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``) and the backend asked for.
:func:`device_plan` reads those facts from torch and the environment; :func:`choose_backend` is the
backend alone, for ``init_with_retry()``. Only :mod:`distinit.init._api` calls them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from distinit.errors import ConflictingEnvError


@dataclass(frozen=True)
class DevicePlan:
    """What one rank uses: the backend, and the CUDA index it binds (None: it computes on the CPU)."""

    backend: str
    device: int | None = None


def plan_device(
    backend: str | None,
    *,
    visible: int,
    cuda_visible_devices: str | None,
    local_rank: int,
    local_world_size: int | None,
) -> DevicePlan:
    """The backend and the device of one rank, from what it sees. Pure.

    * a backend other than NCCL is named: that backend on the CPU;
    * no backend named and no device visible: gloo on the CPU;
    * the rank sees at least as many devices as its host runs ranks (``LOCAL_WORLD_SIZE``, or at least
      ``LOCAL_RANK + 1``): NCCL on ``cuda:LOCAL_RANK`` (every rank sees every GPU of the host);
    * it sees fewer, and the launcher gave it devices of its own (``CUDA_VISIBLE_DEVICES`` set: Slurm's
      ``--gpus-per-task``, a per-rank wrapper): NCCL on ``cuda:LOCAL_RANK % visible`` (``cuda:0`` with
      one device each). Two ranks that land on one physical GPU anyway are refused once the group
      exists, by GPU UUID (:func:`distinit._identity.shared_gpus`).

    Raises:
        ConflictingEnvError: the rank sees fewer devices than its host runs ranks and no
            ``CUDA_VISIBLE_DEVICES`` (every rank sees the same devices), and NCCL is named or would be
            chosen: ranks would share a GPU. Every rank of the host computes the same facts, so every one
            raises the same error at once.
    """
    if backend not in (None, "nccl"):
        return DevicePlan(backend)
    if visible == 0:
        # Named NCCL without a device: binding cuda:LOCAL_RANK fails in torch with its own message.
        return DevicePlan("gloo") if backend is None else DevicePlan("nccl", local_rank)
    here = max(local_rank + 1, local_world_size or 0)
    if visible >= here:
        return DevicePlan("nccl", local_rank)
    if cuda_visible_devices:
        return DevicePlan("nccl", local_rank % visible)
    raise ConflictingEnvError(
        f"{here} ranks on this host (LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world_size}) but "
        f"{visible} CUDA device(s) visible to each (CUDA_VISIBLE_DEVICES is unset), with "
        f"{'NCCL named' if backend else 'no backend named (NCCL chosen where CUDA exists)'}: "
        f"ranks would share a GPU",
        variables=("LOCAL_WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"),
        why="the launcher starts more ranks per host than this host has GPUs, and every rank sees the same "
        "GPUs: NCCL refuses two ranks on one GPU",
        fix=f"launch at most {visible} rank(s) per host (torchrun --nproc-per-node={visible}, "
        "srun --ntasks-per-node), or give each rank GPUs of its own (srun --gpus-per-task=1, or "
        "CUDA_VISIBLE_DEVICES per rank), or name the backend for a CPU job: setup('gloo') / "
        "init_with_retry('gloo')",
    )


def choose_backend(
    backend: str | None,
    *,
    local_rank: int,
    local_world_size: int | None = None,
    device_id: int | torch.device | None = None,
) -> str:
    """``backend`` if given; NCCL when ``device_id`` is given; else :func:`plan_device`'s choice.

    :func:`distinit.setup` binds the GPU exactly when its plan says NCCL, so both agree by construction.

    Raises:
        ConflictingEnvError: no backend named and ranks would share a GPU (see :func:`plan_device`).
    """
    if backend is not None:
        return backend
    if device_id is not None:
        return "nccl"
    return device_plan(backend, local_rank=local_rank, local_world_size=local_world_size).backend


def device_plan(backend: str | None, *, local_rank: int, local_world_size: int | None) -> DevicePlan:
    """:func:`plan_device` over this process's facts (torch's device count, ``CUDA_VISIBLE_DEVICES``)."""
    visible = torch.cuda.device_count() if backend is not None or torch.cuda.is_available() else 0
    return plan_device(
        backend,
        visible=visible,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        local_rank=local_rank,
        local_world_size=local_world_size,
    )
