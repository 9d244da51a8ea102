"""``broadcast_object``: typed objects as pydantic JSON, validated on receipt; never pickle.

Small payloads (up to 4 KiB of JSON, no tensors) ride inside the header collective, so a typical
config costs one header exchange. Tensors inside an object are replaced by markers in the JSON and
their bytes travel after it in the same payload collective, so receivers always know how many
bytes to expect from the header alone, even when they then reject the JSON. What src may send is
capped (``max_bytes=``, checked on every rank before any allocation): parsing JSON costs many times
its size in memory.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, TypeVar, overload

import pydantic
import torch
from pydantic_core import PydanticSerializationError

from distinit.broadcast import _header, _mismatch
from distinit.broadcast._bounds import max_object_bytes
from distinit.broadcast._codec import decode, encode, schema_fingerprint
from distinit.broadcast._group import CallContext, resolve
from distinit.broadcast._handshake import handshake
from distinit.broadcast._mismatch import rank_error
from distinit.broadcast._transport.pack import allocate, as_bytes, broadcast_bytes, from_bytes, wait_or_raise
from distinit.errors import BroadcastMismatchError

logger = logging.getLogger("distinit.broadcast")

T = TypeVar("T")

CALL = "broadcast_object"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _payload_error(ctx: CallContext, tp: Any, exc: Exception) -> BroadcastMismatchError:
    detail = str(exc).splitlines()
    return rank_error(
        ctx,
        f"the payload from src rank {ctx.src} does not validate as {_type_name(tp)} on rank {ctx.rank}: "
        f"{' / '.join(detail[:4])[:600]}",
        field="payload",
        view=f"rejected the payload ({type(exc).__name__})",
        at_fault=(ctx.src,),
        why="the bytes src sent are not a valid instance of this rank's type= (a corrupt or hostile peer, or a "
        "custom serializer on src); nothing from the payload was executed or kept",
        fix=f"check what src rank {ctx.src} passes; every rank must run the same code and pass the same type=",
    )


@overload
def broadcast_object(
    obj: T | None,
    src: int = 0,
    *,
    type: type[T],
    group: Any = None,
    timeout: float | timedelta | None = None,
    max_bytes: int | None = None,
) -> T: ...


@overload
def broadcast_object(
    obj: Any,
    src: int = 0,
    *,
    type: Any,
    group: Any = None,
    timeout: float | timedelta | None = None,
    max_bytes: int | None = None,
) -> Any: ...


def broadcast_object(
    obj: Any,
    src: int = 0,
    *,
    type: Any,  # the API spells it `type=`
    group: Any = None,
    timeout: float | timedelta | None = None,
    max_bytes: int | None = None,
) -> Any:
    """Broadcast a typed object from group rank ``src``; receivers get a freshly validated copy.

    The object is serialised with pydantic (``TypeAdapter(type)``: pydantic models, dataclasses,
    TypedDicts, scalars, and lists/dicts of them) and validated against ``type`` on receipt. Nothing
    is pickled and nothing a peer sends is executed. Every rank's schema fingerprint is compared
    first, so a receiver with another version of the model fails on every rank together. JSON up
    to 4 KiB rides inside the header collective: one collective per call. Tensors inside the object
    travel as bytes after the JSON and land on CPU (gloo) or the current CUDA device (NCCL).

    Args:
        obj: on src, the object; ignored on receivers (pass ``None``).
        src: the source rank *within* ``group``.
        type: the type every rank expects (the same on every rank), e.g. ``TrainConfig`` or
            ``list[TrainConfig]``.
        group: the process group; ``None`` means the default group.
        timeout: seconds (or a timedelta) to wait for each collective of this call.
        max_bytes: the most bytes (JSON plus tensors) this rank accepts from src (default:
            ``DISTINIT_BROADCAST_MAX_BYTES``, else 64 MiB), checked on every rank before anything is
            allocated. Validating JSON takes up to ~20x its size in memory: raise it with care.

    Returns:
        On src, ``obj`` itself; on receivers, the validated object.

    Raises:
        BroadcastMismatchError: on every rank when the ranks disagree on src, call order or schema,
            src's object does not serialise as ``type`` (``field="argument"``), src's header is
            malformed (``field="header"``) or src sends more than a rank's ``max_bytes``
            (``field="size"``); on the receivers only, when src's payload does not validate there
            (``field="payload"``, chained to the pydantic error).
        BroadcastTimeoutError: ``timeout`` expired or a peer died (on the waiting rank).
        TypeError, ValueError: ``timeout`` or ``max_bytes`` is not valid (on this rank, before any exchange).
    """
    limit = max_object_bytes(max_bytes)
    ctx = resolve(group).next_call(op=_header.OP_OBJECT, src=src, timeout=timeout)
    status, cause, fingerprint, payload, tensors = _prepare(obj, type, is_src=ctx.rank == src)
    fits = ctx.rank == src and status == _mismatch.OK and not tensors and len(payload) <= _header.INLINE_BYTES
    words = _row(
        ctx, status=status, fingerprint=fingerprint, payload=payload, tensors=tensors, limit=limit, inline=fits
    )
    exchanged = handshake(ctx, words, inline=payload if fits else None, cause=cause)
    sv = exchanged.views[src]
    if logger.isEnabledFor(logging.DEBUG):
        _log(ctx, sv, type)
    if ctx.rank == src:
        if sv.inline == _header.NOT_INLINE and ctx.size > 1:  # a world of one: nobody to send to
            _send(ctx, payload, tensors)
        return obj
    if sv.inline != _header.NOT_INLINE:
        return _decode_or_raise(ctx, exchanged.inline_bytes(src), _NO_TENSOR_BYTES, count=0, tp=type)
    return _receive(ctx, sv, type)


_NO_TENSOR_BYTES = torch.empty(0, dtype=torch.uint8)
_NO_TENSORS: list[torch.Tensor] = []  # never mutated: shared by every call without tensors


def _row(
    ctx: CallContext,
    *,
    status: int,
    fingerprint: int,
    payload: bytes,
    tensors: list[torch.Tensor],
    limit: int,
    inline: bool,
) -> list[int]:
    """This rank's header words; ``inline``: src's JSON rides in the row (it is all src sends, and fits)."""
    return _header.fixed_words(
        seq=ctx.seq,
        op=_header.OP_OBJECT,
        src=ctx.src,
        status=status,
        nbytes=sum(t.nbytes for t in tensors) if tensors else 0,
        fingerprint=fingerprint,
        count=len(tensors),
        aux_nbytes=len(payload),
        inline=len(payload) if inline else _header.NOT_INLINE,
        global_rank=ctx.global_rank,
        limit=limit,
    )


def _prepare(obj: Any, tp: Any, *, is_src: bool) -> tuple[int, Exception | None, int, bytes, list[torch.Tensor]]:
    """(status, cause, schema fingerprint, JSON, tensors): ``tp`` fingerprinted and, on src, ``obj`` encoded.

    A type without a schema or an object that does not serialise becomes a status word (and the
    cause chained to this rank's error), never a raise on this rank alone.
    """
    try:
        fingerprint = schema_fingerprint(tp)
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        return _mismatch.BAD_TYPE, exc, 0, b"", _NO_TENSORS
    if not is_src:
        return _mismatch.OK, None, fingerprint, b"", _NO_TENSORS
    try:
        payload, tensors = encode(obj, tp)
    except (PydanticSerializationError, pydantic.ValidationError, TypeError, ValueError) as exc:
        return _mismatch.SERIALIZE_FAILED, exc, fingerprint, b"", _NO_TENSORS
    return _mismatch.OK, None, fingerprint, payload, tensors


def _log(ctx: CallContext, sv: _header.View, tp: Any) -> None:
    logger.debug(
        "rank %d: %s call #%d from src %d: %s, %d JSON bytes%s, %d tensors",
        ctx.rank,
        CALL,
        ctx.seq,
        ctx.src,
        _type_name(tp),
        sv.aux_nbytes,
        " inline" if sv.inline != _header.NOT_INLINE else "",
        sv.count,
        extra=ctx.log_facts(nbytes=sv.aux_nbytes + sv.nbytes),
    )


def _send(ctx: CallContext, payload: bytes, tensors: list[torch.Tensor]) -> None:
    """Src: the JSON, then each tensor's bytes, in one payload broadcast."""
    parts = [from_bytes(payload), *(as_bytes(t.detach().to("cpu").contiguous()) for t in tensors)]
    wire = torch.cat(parts).to(ctx.comm_device)
    wait_or_raise(broadcast_bytes(wire, ctx), ctx, "payload broadcast")


def _receive(ctx: CallContext, sv: _header.View, tp: Any) -> Any:
    """Receivers: exactly the bytes src announced (the verdict checked them against every rank's cap)."""
    total = sv.aux_nbytes + sv.nbytes
    raw = bytearray(total)  # received into directly on CPU: no copy before the JSON parser
    if ctx.comm_device.type == "cpu" and total:
        wait_or_raise(broadcast_bytes(torch.frombuffer(raw, dtype=torch.uint8), ctx), ctx, "payload broadcast")
    else:
        wire = allocate(ctx, (total,), dtype=torch.uint8, device=ctx.comm_device)
        wait_or_raise(broadcast_bytes(wire, ctx), ctx, "payload broadcast")
        if total:
            torch.frombuffer(raw, dtype=torch.uint8).copy_(wire)
    tensor_bytes = torch.frombuffer(raw, dtype=torch.uint8)[sv.aux_nbytes :] if sv.nbytes else _NO_TENSOR_BYTES
    payload = raw if not sv.nbytes else raw[: sv.aux_nbytes]
    return _decode_or_raise(ctx, payload, tensor_bytes, count=sv.count, tp=tp)


def _decode_or_raise(
    ctx: CallContext, payload: bytes | bytearray, tensor_bytes: torch.Tensor, *, count: int, tp: Any
) -> Any:
    try:
        return decode(payload, tensor_bytes, count=count, tp=tp, device=ctx.comm_device)
    except (pydantic.ValidationError, ValueError, TypeError, RecursionError, RuntimeError) as exc:
        raise _payload_error(ctx, tp, exc) from exc
