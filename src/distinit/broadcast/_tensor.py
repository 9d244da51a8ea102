"""``broadcast_tensor``: one checked tensor broadcast, receivers allocating from src's header."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch

from distinit.broadcast import _header, _mismatch
from distinit.broadcast._dtypes import DTYPE_OF_CODE, describe, device_type_code, dtype_code
from distinit.broadcast._group import CallContext, resolve
from distinit.broadcast._transport import (
    broadcast_bytes,
    copy_back,
    receive_view,
    timeout_error,
    wait_or_raise,
    wire_view,
)

logger = logging.getLogger("distinit.broadcast")

CALL = "broadcast_tensor"


def _status_of(tensor: object, is_src: bool) -> int:
    if tensor is None:
        return _mismatch.SRC_PASSED_NONE if is_src else _mismatch.OK
    if not isinstance(tensor, torch.Tensor):
        return _mismatch.NOT_A_TENSOR
    if tensor.layout != torch.strided:
        return _mismatch.NOT_STRIDED
    if dtype_code(tensor.dtype) < 0:
        return _mismatch.UNSUPPORTED_DTYPE
    if tensor.dim() > _header.MAX_NDIM:
        return _mismatch.TOO_MANY_DIMS
    return _mismatch.OK


_CUDA_CODE = device_type_code(torch.device("cuda"))
_CPU_CODE = device_type_code(torch.device("cpu"))
_CPU = torch.device("cpu")


def _receiver_device(device: torch.device | str | None, src_device_code: int, ctx: CallContext) -> torch.device:
    if device is not None:
        return torch.device(device)
    if src_device_code == _CUDA_CODE and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if ctx.comm_device.type == "cuda":
        return ctx.comm_device
    return _CPU


def broadcast_tensor(
    tensor: torch.Tensor | None,
    src: int = 0,
    *,
    group: Any = None,
    device: torch.device | str | None = None,
    timeout: float | timedelta | None = None,
) -> torch.Tensor:
    """Broadcast a tensor from group rank ``src``, checked on every rank first.

    One all-to-all of a small int64 header lets every rank compare src, dtype, shape and device
    type with every other rank before any payload moves; tensors up to 4 KiB travel inside that
    same collective. Payloads travel as uint8 views, so every dtype works on gloo (bool, bfloat16,
    float8, int16, uint16/32/64, complex).

    Args:
        tensor: on src, the data. On receivers, ``None`` (a tensor is allocated from src's header)
            or a buffer that must match src's dtype, shape and device type; it is filled in place.
        src: the source rank *within* ``group`` (group-local, like torch's ``group_src``).
        group: the process group; ``None`` means the default group.
        device: where receivers passing ``None`` allocate. Default: the current CUDA device if src's
            tensor is on CUDA and this rank has one (or the backend is NCCL), else CPU.
        timeout: seconds (or a timedelta) to wait for each collective of this call; ``None`` waits
            for the process-group timeout. After a timeout the group is unusable.

    Returns:
        On src, ``tensor`` itself; on receivers, the filled buffer or a new tensor.

    Raises:
        BroadcastMismatchError: ranks disagree on src, dtype, shape, device type or call order, or
            a rank passed an unusable argument: raised on every rank of the group, before any
            payload is written. Also raised (on the waiting rank) when ``timeout`` expires.
        RuntimeError: torch.distributed is not initialised.
    """
    ctx = resolve(group, timeout)
    is_src = ctx.rank == src
    status = _status_of(tensor, is_src)
    usable = tensor if status == _mismatch.OK and isinstance(tensor, torch.Tensor) else None
    inline: torch.Tensor | None = None
    if usable is not None:
        nbytes = usable.nbytes
        dev_code = _CPU_CODE if usable.is_cpu else device_type_code(usable.device)  # .device costs 0.4 µs
        if is_src and nbytes <= _header.INLINE_BYTES:
            inline = usable  # its raw bytes ride in the header row (staged through CPU when needed)
        words = _header.fixed_words(
            seq=ctx.seq, op=_header.OP_TENSOR, src=src, has_buffer=True, status=status,
            dtype=dtype_code(usable.dtype), device=dev_code, shape=usable.shape, nbytes=nbytes,
            inline=nbytes if inline is not None else _header.NOT_INLINE, global_rank=ctx.global_rank,
        )  # fmt: skip
    else:
        words = _header.fixed_words(
            seq=ctx.seq, op=_header.OP_TENSOR, src=src, status=status, global_rank=ctx.global_rank
        )
    try:
        exchanged = ctx.exchange(words, inline)
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, CALL, src, "header exchange", exc) from exc
    verdict = _mismatch.judge(exchanged.views, my_op=_header.OP_TENSOR, seq=ctx.seq)
    if verdict is not None:
        raise verdict.error() from (TypeError(_mismatch.STATUS_TEXT[status]) if status else None)
    sv = exchanged.views[src]
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "rank %d: %s call #%d from src %d: %s, %d bytes%s",
            ctx.rank, CALL, ctx.seq, src, describe(sv.dtype, sv.shape), sv.nbytes,
            " inline" if sv.inline != _header.NOT_INLINE else "",
            extra={"distinit": {"event": "broadcast.call", "call": CALL, "seq": ctx.seq, "src": src,
                                "rank": ctx.rank, "nbytes": sv.nbytes}},
        )  # fmt: skip
    if is_src:
        if usable is None:  # unreachable: the verdict checked src's status
            raise RuntimeError(f"{CALL}: src passed no tensor but the verdict let it through")
        if sv.inline == _header.NOT_INLINE:
            wire, _ = wire_view(usable, ctx.comm_device)
            wait_or_raise(broadcast_bytes(wire, src, ctx), ctx, CALL, src, "payload broadcast")
        return usable
    out = usable
    if out is None:
        dtype = DTYPE_OF_CODE.get(sv.dtype)
        if dtype is None:
            # Take part in the payload collective anyway so src does not hang, then fail here.
            if sv.inline == _header.NOT_INLINE:
                sink = torch.empty(sv.nbytes, dtype=torch.uint8, device=ctx.comm_device)
                wait_or_raise(broadcast_bytes(sink, src, ctx), ctx, CALL, src, "payload broadcast")
            raise TypeError(
                f"{CALL} call #{ctx.seq}: src sent dtype code {sv.dtype}, which this torch "
                f"({torch.__version__}) does not know; run the same torch version on every rank"
            )
        out = torch.empty(sv.shape, dtype=dtype, device=_receiver_device(device, sv.device, ctx))
    if sv.inline != _header.NOT_INLINE:
        if not exchanged.copy_inline_into(src, out):
            copy_back(out, exchanged.inline_payload(src))  # copy_ moves it to out's device
        return out
    buf, staged = receive_view(out, ctx.comm_device)
    wait_or_raise(broadcast_bytes(buf, src, ctx), ctx, CALL, src, "payload broadcast")
    if staged:
        copy_back(out, buf)
    return out
