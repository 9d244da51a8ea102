"""``broadcast_object``: typed objects as pydantic JSON, validated on receipt; never pickle.

Small payloads (up to 4 KiB of JSON, no tensors) ride inside the header collective, so a typical
config costs one all-to-all header exchange. Tensors inside an object are replaced by markers in the JSON and
their bytes travel after it in the same payload collective, so receivers always know how many
bytes to expect from the header alone, even when they then reject the JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from datetime import timedelta
from typing import Any, TypeVar, overload

import pydantic
import torch
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticSerializationError, core_schema

from distinit.broadcast import _header, _mismatch
from distinit.broadcast._dtypes import DTYPE_OF_CODE, dtype_code
from distinit.broadcast._group import CallContext, resolve
from distinit.broadcast._transport import as_bytes, broadcast_bytes, timeout_error, wait_or_raise
from distinit.errors import BroadcastMismatchError

logger = logging.getLogger("distinit.broadcast")

T = TypeVar("T")

CALL = "broadcast_object"
TENSOR_MARK = "__distinit_tensor__"
MAX_PAYLOAD_BYTES = 1 << 31
"""Receivers refuse headers announcing more than this (2 GiB): a corrupt peer cannot make them allocate wildly."""


class _SchemaOfArbitraryTypes(GenerateJsonSchema):
    """JSON schema that names arbitrary types (``torch.Tensor`` fields) instead of failing."""

    def handle_invalid_for_json_schema(self, schema: core_schema.CoreSchema, error_info: str) -> JsonSchemaValue:
        return {"x-distinit-arbitrary": error_info}


@functools.lru_cache(maxsize=256)
def _adapter(tp: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(tp)


@functools.lru_cache(maxsize=256)
def schema_fingerprint(tp: Any) -> int:
    """A 63-bit fingerprint of ``tp``'s JSON schema: equal on every rank running the same code.

    Field names, types, constraints and class titles all enter it, so receivers built from an
    older or different model are caught before any payload is decoded.
    """
    try:
        schema = _adapter(tp).json_schema(schema_generator=_SchemaOfArbitraryTypes)
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except Exception:  # types without a JSON schema still get a stable, name-based fingerprint
        text = f"{getattr(tp, '__module__', '')}.{getattr(tp, '__qualname__', repr(tp))}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def encode(obj: Any, tp: Any) -> tuple[bytes, list[torch.Tensor]]:
    """JSON bytes for ``obj`` as type ``tp``, with each tensor replaced by a marker (and returned).

    Raises:
        PydanticSerializationError: ``obj`` does not serialise as ``tp`` (wrong type, unknown value).
    """
    tensors: list[torch.Tensor] = []

    def fallback(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return {TENSOR_MARK: len(tensors) - 1, "dtype": dtype_code(value.dtype), "shape": list(value.shape)}
        raise PydanticSerializationError(f"cannot serialise a {type(value).__qualname__} without pickle")

    payload = _adapter(tp).dump_json(obj, fallback=fallback, warnings="error")
    return payload, tensors


def _walk_markers(data: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(data, dict):
        if TENSOR_MARK in data:
            index = data[TENSOR_MARK]
            if not isinstance(index, int) or not 0 <= index < len(tensors):
                raise ValueError(f"tensor marker {index!r} does not name one of the {len(tensors)} tensors sent")
            return tensors[index]
        return {k: _walk_markers(v, tensors) for k, v in data.items()}
    if isinstance(data, list):
        return [_walk_markers(v, tensors) for v in data]
    return data


def _tensor_specs(data: Any) -> list[tuple[int, torch.dtype, tuple[int, ...]]]:
    """The (index, dtype, shape) of every marker in parsed JSON, in index order, validated."""
    found: dict[int, tuple[torch.dtype, tuple[int, ...]]] = {}
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if TENSOR_MARK in item:
                index, code, shape = item.get(TENSOR_MARK), item.get("dtype"), item.get("shape")
                dtype = DTYPE_OF_CODE.get(code) if isinstance(code, int) else None
                if (
                    not isinstance(index, int)
                    or dtype is None
                    or not isinstance(shape, list)
                    or not all(isinstance(d, int) and d >= 0 for d in shape)
                ):
                    raise ValueError(f"malformed tensor marker {str(item)[:200]}")
                found[index] = (dtype, tuple(shape))
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"tensor markers are not numbered 0..{len(found) - 1}: {sorted(found)[:10]}")
    return [(i, *found[i]) for i in range(len(found))]


def decode(payload: bytes, tensor_bytes: torch.Tensor, count: int, tp: Any, device: torch.device) -> Any:
    """Validate ``payload`` as ``tp``, rebuilding ``count`` tensors from ``tensor_bytes``.

    Raises:
        pydantic.ValidationError: the JSON does not validate as ``tp``.
        ValueError: the JSON or its tensor markers are malformed.
    """
    adapter = _adapter(tp)
    if count == 0:
        return adapter.validate_json(payload)
    try:
        data = json.loads(payload)
    except RecursionError as exc:
        raise ValueError("payload JSON nests too deeply") from exc
    specs = _tensor_specs(data)
    if len(specs) != count:
        raise ValueError(f"header announces {count} tensors, the JSON marks {len(specs)}")
    tensors: list[torch.Tensor] = []
    offset = 0
    for _, dtype, shape in specs:
        nbytes = int(torch.Size(shape).numel()) * dtype.itemsize
        if offset + nbytes > tensor_bytes.numel():
            raise ValueError("tensor markers describe more bytes than were sent")
        out = torch.empty(shape, dtype=dtype, device=device)
        as_bytes(out).copy_(tensor_bytes[offset : offset + nbytes])
        tensors.append(out)
        offset += nbytes
    if offset != tensor_bytes.numel():
        raise ValueError(f"tensor markers describe {offset} bytes, {tensor_bytes.numel()} were sent")
    return adapter.validate_python(_walk_markers(data, tensors))


def to_bytes(data: torch.Tensor) -> bytes:
    """Python bytes from a CPU uint8 tensor, in one copy (no numpy needed)."""
    out = bytearray(data.numel())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(data)
    return bytes(out)


def from_bytes(data: bytes) -> torch.Tensor:
    """A CPU uint8 tensor holding ``data`` (a copy; torch.frombuffer needs a writable buffer)."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _payload_error(ctx: CallContext, src: int, tp: Any, exc: Exception) -> BroadcastMismatchError:
    detail = str(exc).splitlines()
    return BroadcastMismatchError(
        f"{CALL} call #{ctx.seq} (src={src}, {ctx.size} ranks): the payload from src does not validate as "
        f"{_type_name(tp)} on rank {ctx.rank}: {' / '.join(detail[:4])[:600]}",
        call=CALL,
        seq=ctx.seq,
        field="payload",
        src=src,
        views={ctx.rank: f"rejected the payload ({type(exc).__name__})"},
        ranks=(ctx.rank,),
        why="the bytes src sent are not a valid instance of this rank's type= (a corrupt or hostile peer, or a "
        "custom serializer on src); nothing from the payload was executed or kept",
        fix=f"check what src rank {src} passes; every rank must run the same code and pass the same type=",
    )


@overload
def broadcast_object(
    obj: T | None, src: int = 0, *, type: type[T], group: Any = None, timeout: float | timedelta | None = None
) -> T: ...


@overload
def broadcast_object(
    obj: Any, src: int = 0, *, type: Any, group: Any = None, timeout: float | timedelta | None = None
) -> Any: ...


def broadcast_object(
    obj: Any,
    src: int = 0,
    *,
    type: Any,  # the API spells it `type=`
    group: Any = None,
    timeout: float | timedelta | None = None,
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

    Returns:
        On src, ``obj`` itself; on receivers, the validated object.

    Raises:
        BroadcastMismatchError: on every rank when the ranks disagree on src, call order or schema,
            or src's object does not serialise as ``type`` (``field="argument"``); on a receiver
            only, when src's payload does not validate there (``field="payload"``, chained to the
            pydantic error); on the waiting rank when ``timeout`` expires.
    """
    tp = type
    ctx = resolve(group, timeout)
    is_src = ctx.rank == src
    status = _mismatch.OK
    local_exc: Exception | None = None
    payload = b""
    tensors: list[torch.Tensor] = []
    fingerprint = 0
    try:
        fingerprint = schema_fingerprint(tp)
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        status, local_exc = _mismatch.BAD_TYPE, exc
    if is_src and status == _mismatch.OK:
        try:
            payload, tensors = encode(obj, tp)
        except (PydanticSerializationError, pydantic.ValidationError, TypeError, ValueError) as exc:
            status, local_exc = _mismatch.SERIALIZE_FAILED, exc
    tensor_nbytes = sum(t.numel() * t.element_size() for t in tensors)
    fits_inline = not tensors and len(payload) <= _header.INLINE_BYTES
    inline = payload if is_src and fits_inline and status == _mismatch.OK else None
    words = _header.fixed_words(
        seq=ctx.seq,
        op=_header.OP_OBJECT,
        src=src,
        status=status,
        nbytes=tensor_nbytes,
        fingerprint=fingerprint,
        count=len(tensors),
        aux_nbytes=len(payload),
        inline=len(payload) if is_src and fits_inline and status == _mismatch.OK else _header.NOT_INLINE,
        global_rank=ctx.global_rank,
    )
    try:
        exchanged = ctx.exchange(words, inline)
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, CALL, src, "header exchange", exc) from exc
    verdict = _mismatch.judge(exchanged.views, my_op=_header.OP_OBJECT, seq=ctx.seq)
    if verdict is not None:
        raise verdict.error() from local_exc
    sv = exchanged.views[src]
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "rank %d: %s call #%d from src %d: %s, %d JSON bytes%s, %d tensors",
            ctx.rank, CALL, ctx.seq, src, _type_name(tp), sv.aux_nbytes,
            " inline" if sv.inline != _header.NOT_INLINE else "", sv.count,
            extra={"distinit": {"event": "broadcast.call", "call": CALL, "seq": ctx.seq, "src": src,
                                "rank": ctx.rank, "nbytes": sv.aux_nbytes + sv.nbytes}},
        )  # fmt: skip
    if sv.inline != _header.NOT_INLINE:
        if is_src:
            return obj
        raw = exchanged.inline_bytes(src)
        return _decode_or_raise(raw, torch.empty(0, dtype=torch.uint8), 0, tp, ctx, src)
    total = sv.aux_nbytes + sv.nbytes
    if not 0 <= total <= MAX_PAYLOAD_BYTES or sv.count < 0:
        # Refuse before allocating; src's header was checked by src itself, so this is a corrupt peer.
        raise _payload_error(ctx, src, tp, ValueError(f"header announces {total} bytes and {sv.count} tensors"))
    if is_src:
        parts = [from_bytes(payload)]
        parts += [as_bytes(t.detach().to("cpu").contiguous()) for t in tensors]
        wire = torch.cat(parts).to(ctx.comm_device) if parts else torch.empty(0, dtype=torch.uint8)
        wait_or_raise(broadcast_bytes(wire, src, ctx), ctx, CALL, src, "payload broadcast")
        return obj
    wire = torch.empty(total, dtype=torch.uint8, device=ctx.comm_device)
    wait_or_raise(broadcast_bytes(wire, src, ctx), ctx, CALL, src, "payload broadcast")
    wire = wire.cpu()
    return _decode_or_raise(to_bytes(wire[: sv.aux_nbytes]), wire[sv.aux_nbytes :], sv.count, tp, ctx, src)


def _decode_or_raise(
    payload: bytes, tensor_bytes: torch.Tensor, count: int, tp: Any, ctx: CallContext, src: int
) -> Any:
    device = ctx.comm_device
    try:
        return decode(payload, tensor_bytes, count, tp, device)
    except (pydantic.ValidationError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise _payload_error(ctx, src, tp, exc) from exc
