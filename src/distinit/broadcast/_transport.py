"""Moving bytes once the verdict is in: uint8 wire views, staging, bounded waits, timeouts."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distinit.broadcast import _header
from distinit.broadcast._group import CallContext
from distinit.errors import BroadcastMismatchError


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy); any dtype, including 0-d and empty."""
    return tensor.reshape(-1).view(torch.uint8)


def wire_view(tensor: torch.Tensor, comm_device: torch.device) -> tuple[torch.Tensor, bool]:
    """The uint8 tensor to put on the wire for ``tensor``, and whether it is a staging copy.

    In place (zero copy) when the tensor is contiguous and already on ``comm_device``; otherwise a
    contiguous copy there (gloo with CUDA tensors, non-contiguous tensors).
    """
    if tensor.device == comm_device and tensor.is_contiguous() and not is_lazy(tensor):
        return as_bytes(tensor), False
    return as_bytes(tensor.detach().resolve_conj().resolve_neg().to(comm_device).contiguous()), True


def is_lazy(tensor: torch.Tensor) -> bool:
    """A conjugate or negative view: its memory holds other values than it reads as."""
    return tensor.is_conj() or tensor.is_neg()


def receive_view(out: torch.Tensor, comm_device: torch.device) -> tuple[torch.Tensor, bool]:
    """The uint8 tensor to receive into for ``out``, and whether it must be copied back afterwards."""
    if out.device == comm_device and out.is_contiguous() and not is_lazy(out):
        return as_bytes(out), False
    nbytes = out.numel() * out.element_size()
    return torch.empty(nbytes, dtype=torch.uint8, device=comm_device), True


def copy_back(out: torch.Tensor, staged: torch.Tensor) -> None:
    """Copy received bytes from a staging buffer into ``out`` (any device, any layout)."""
    with torch.no_grad():
        if out.is_contiguous() and not is_lazy(out):
            as_bytes(out).copy_(staged)  # a byte copy: bit-exact for every dtype, even odd bool bytes
        else:  # non-contiguous, or a conjugate/negative view: copy values, which torch maps through the view
            out.copy_(staged.view(out.dtype).view(out.shape))


def copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy ``src[i]`` into ``dst[i]`` with one ``torch._foreach_copy_`` (a no-op for a tensor onto itself)."""
    try:
        torch._foreach_copy_(dst, src)
    except RuntimeError:  # mixed devices on an older torch: one copy each
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)


def broadcast_bytes(buf: torch.Tensor, src: int, ctx: CallContext) -> Any:
    """Start an async broadcast of a uint8 buffer from group rank ``src``; returns the work handle."""
    return dist.broadcast(buf, group=ctx.group, group_src=src, async_op=True)


def timeout_error(
    ctx: CallContext, call: str, src: int, phase: str, exc: _header.CollectiveFailed
) -> BroadcastMismatchError:
    """The error for a call whose collective timed out or lost a peer (raised on this rank only)."""
    if exc.timed_out:
        limit = f"{ctx.timeout} s (timeout=)" if ctx.timeout is not None else "the process-group timeout"
        what = f"did not complete its {phase} within {limit}"
    else:
        what = f"lost a peer during its {phase}"
    return BroadcastMismatchError(
        f"{call} call #{ctx.seq} (src={src}, {ctx.size} ranks) {what} on rank {ctx.rank} "
        f"(global rank {ctx.global_rank}): {_first_line(str(exc))}",
        call=call,
        seq=ctx.seq,
        field="timeout" if exc.timed_out else "peer",
        src=src,
        views={ctx.rank: f"waited for the {phase}"},
        ranks=(),
        why="another rank of the group never reached this call (it crashed, hangs, or takes another code path), "
        "or a peer died mid-transfer",
        fix="read the other ranks' logs for the first error; the process group is unusable after this, "
        "so destroy it (or restart the job)",
    )


def _first_line(text: str) -> str:
    """The gloo message without its source-path prefix (``[/__w/.../pair.cc:553] ``), one line, bounded."""
    line = text.strip().splitlines()[0] if text.strip() else "no detail"
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return line[:300]


def wait_or_raise(work: Any, ctx: CallContext, call: str, src: int, phase: str) -> None:
    """Wait for ``work`` within the call's timeout; map failure to :class:`BroadcastMismatchError`."""
    try:
        _header.wait(work, ctx.timeout)
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, call, src, phase, exc) from exc
