"""``nccl`` (opt-in, ``--nccl``): one small all_reduce on an NCCL group, under a short bound.

Every rank decides from the same gathered facts whether to try, so either all ranks enter the NCCL
group or none does. The group's own timeout is set past the doctor's end: NCCL's watchdog tears the
process down when a collective outlives it, and the doctor must report instead; its bound is the
thread bound of :func:`distinit.doctor._bound.bounded`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from distinit._duration import to_timedelta
from distinit._foreign import first_line
from distinit.doctor._bound import bounded
from distinit.doctor._model import Check

#: The all_reduce's bound (communicator set-up included): NCCL's first collective takes a few seconds.
TIMEOUT_S = 20.0
#: Added to the doctor's budget for the NCCL group's own (watchdog) timeout.
WATCHDOG_MARGIN_S = 120.0


def local_device(local_rank: int) -> int | None:
    """The CUDA device this rank would drive (its local rank), or None: no CUDA, no NCCL, or too few devices."""
    import torch
    import torch.distributed as dist

    if not (dist.is_nccl_available() and torch.cuda.is_available()):
        return None
    return local_rank if local_rank < torch.cuda.device_count() else None


def why_not(devices: Mapping[int, int | None]) -> Check | None:
    """``skip`` when no rank has a device, ``fail`` naming the ranks without one, None when all have one."""
    without = sorted(rank for rank, device in devices.items() if device is None)
    if len(without) == len(devices):
        return Check(
            id="nccl",
            status="skip",
            summary="no rank sees a CUDA device with NCCL available (torch.cuda.is_available() is False)",
        )
    if without:
        return Check(
            id="nccl",
            status="fail",
            summary=f"ranks {without} have no CUDA device for their local rank (or no NCCL); the others do",
            fix="give every rank a GPU (one CUDA_VISIBLE_DEVICES entry per local rank) or use gloo",
            ranks=tuple(without),
        )
    return None


def _all_reduce(device: int, world_size: int, *, watchdog_s: float) -> Check:
    import torch
    import torch.distributed as dist

    started = time.monotonic()
    try:
        group = dist.new_group(backend="nccl", timeout=to_timedelta(watchdog_s))
        with torch.cuda.device(device):
            tensor = torch.ones(1, device=f"cuda:{device}")
            dist.all_reduce(tensor, group=group)
            value = int(tensor.item())  # waits for the kernel
        dist.destroy_process_group(group)
    except RuntimeError as exc:  # torch's DistBackendError and CUDA errors: NCCL's own words
        return Check(
            id="nccl",
            status="fail",
            summary=f"NCCL all_reduce on cuda:{device} failed: {type(exc).__name__}: {first_line(exc)}",
            fix="rerun with NCCL_DEBUG=INFO; check NCCL_SOCKET_IFNAME, /dev/shm (`shm`) and NCCL_P2P/IB settings",
            evidence={"device": device},
        )
    elapsed = time.monotonic() - started
    evidence = {"device": device, "sum": value, "elapsed_s": round(elapsed, 4)}
    if value != world_size:
        return Check(
            id="nccl",
            status="fail",
            summary=f"all_reduce of ones over {world_size} ranks gave {value}",
            fix="NCCL returned a wrong sum: rerun with NCCL_DEBUG=INFO and check the topology it prints",
            evidence=evidence,
        )
    summary = f"all_reduce over {world_size} ranks on NCCL in {elapsed:.2f} s (communicator set-up included)"
    return Check(id="nccl", status="pass", summary=summary, evidence=evidence)


def check_nccl(devices: Mapping[int, int | None], *, rank: int, budget: float) -> Check:
    """The ``nccl`` check on this rank, from every rank's :func:`local_device` (the same on every rank)."""
    refused = why_not(devices)
    if refused is not None:
        return refused
    device = devices[rank]
    assert device is not None  # why_not() passed: every rank has one
    timeout = max(1.0, min(TIMEOUT_S, budget))
    return bounded(
        "nccl",
        lambda: _all_reduce(device, len(devices), watchdog_s=budget + WATCHDOG_MARGIN_S),
        timeout=timeout,
        waiting_for="the NCCL communicator and one all_reduce (NCCL_DEBUG=INFO shows where it stops)",
    )
