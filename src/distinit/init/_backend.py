"""The one backend choice: which backend a rank uses when the caller names none."""

from __future__ import annotations

import torch


def choose_backend(backend: str | None, *, local_rank: int, device_id: int | torch.device | None = None) -> str:
    """``backend`` if given; else NCCL when ``device_id`` is given or ``local_rank`` names a visible GPU; else gloo.

    :func:`distinit.setup` binds the GPU exactly when this returns ``"nccl"``, so both agree by construction.
    """
    if backend is not None:
        return backend
    if device_id is not None:
        return "nccl"
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return "nccl"
    return "gloo"
