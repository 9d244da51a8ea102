"""Typed objects as bytes: pydantic JSON with tensors as markers, a schema fingerprint, strict decoding.

Never pickle: :func:`encode` is pydantic's ``dump_json`` and :func:`decode` its ``validate_json`` (or,
with tensors, ``json.loads`` then ``validate_python``), so nothing a peer sends is executed. Tensors
inside an object become markers (index, dtype code, shape) and their bytes travel after the JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

import pydantic
import torch
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticSerializationError, core_schema

from distinit.broadcast._dtypes import DTYPE_OF_CODE, dtype_code
from distinit.broadcast._transport.pack import as_bytes

TENSOR_MARK = "__distinit_tensor__"
MAX_DEPTH = 200
"""Payload JSON with tensors may nest this deep (markers are found and replaced by walking it)."""
MAX_MARKER_NDIM = 64


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
    """``data`` with every marker replaced by its tensor (recursive: :func:`_tensor_specs` bounded the depth)."""
    if isinstance(data, dict):
        if TENSOR_MARK in data:
            return tensors[data[TENSOR_MARK]]  # _tensor_specs checked every index
        return {k: _walk_markers(v, tensors) for k, v in data.items()}
    if isinstance(data, list):
        return [_walk_markers(v, tensors) for v in data]
    return data


def _tensor_specs(data: Any) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """The (dtype, shape) of every marker in parsed JSON, in index order, validated; no deeper than MAX_DEPTH.

    Raises:
        ValueError: a marker is malformed, markers are not numbered 0..n-1, or the JSON nests too deeply.
    """
    found: dict[int, tuple[torch.dtype, tuple[int, ...]]] = {}
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"payload JSON with tensors nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            if TENSOR_MARK in item:
                index, spec = _marker(item)
                found[index] = spec
            else:
                stack.extend((value, depth + 1) for value in item.values())
        elif isinstance(item, list):
            stack.extend((value, depth + 1) for value in item)
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"tensor markers are not numbered 0..{len(found) - 1}: {sorted(found)[:10]}")
    return [found[i] for i in range(len(found))]


def _marker(item: dict[str, Any]) -> tuple[int, tuple[torch.dtype, tuple[int, ...]]]:
    index, code, shape = item.get(TENSOR_MARK), item.get("dtype"), item.get("shape")
    dtype = DTYPE_OF_CODE.get(code) if type(code) is int else None
    if (
        type(index) is not int
        or dtype is None
        or not isinstance(shape, list)
        or len(shape) > MAX_MARKER_NDIM
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise ValueError(f"malformed tensor marker {str(item)[:200]}")
    return index, (dtype, tuple(shape))


def decode(payload: bytes | bytearray, tensor_bytes: torch.Tensor, *, count: int, tp: Any, device: torch.device) -> Any:
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
    for dtype, shape in specs:
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes > tensor_bytes.numel():
            raise ValueError("tensor markers describe more bytes than were sent")
        out = torch.empty(shape, dtype=dtype, device=device)  # within the bytes received: bounded
        as_bytes(out).copy_(tensor_bytes[offset : offset + nbytes])
        tensors.append(out)
        offset += nbytes
    if offset != tensor_bytes.numel():
        raise ValueError(f"tensor markers describe {offset} bytes, {tensor_bytes.numel()} were sent")
    return adapter.validate_python(_walk_markers(data, tensors))
