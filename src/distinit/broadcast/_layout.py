"""A state dict's layout: its fingerprint (keys, dtypes, shapes), the metadata JSON, and how two differ.

Every rank fingerprints its tensors on every call (the header compares the fingerprints); the full
metadata (``[[key, dtype code, shape], ...]``) travels only when receivers allocate from src's, or
when fingerprints differ and the ranks compare metadata to say exactly which keys differ. Metadata
from a peer is never trusted: :func:`decode_meta` checks every field against the protocol's bounds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
from collections.abc import Sequence

import torch

from distinit.broadcast._bounds import MAX_TENSOR_BYTES
from distinit.broadcast._dtypes import CODE_OF_DTYPE, ITEMSIZE_OF_CODE, describe, dtype_code

MAX_LISTED = 5

Entry = tuple[str, int, tuple[int, ...]]  # key, dtype code, shape


def entries(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> list[Entry]:
    """The metadata of ``tensors`` under ``names``."""
    return [(n, dtype_code(t.dtype), tuple(t.shape)) for n, t in zip(names, tensors, strict=True)]


def encode_meta(meta: Sequence[Entry]) -> bytes:
    """Metadata as compact JSON ``[[key, dtype code, shape], ...]`` (sent only when needed)."""
    return json.dumps(meta, separators=(",", ":")).encode()


@dataclasses.dataclass(frozen=True)
class Layout:
    """What one rank knows about its tensors, computed in one pass (hot path: 2000 tensors a call)."""

    fingerprint: int
    count: int
    unsupported: bool  # a dtype without a wire code (quantized)


_DTYPE_OF = operator.attrgetter("dtype")
_SHAPE_OF = operator.attrgetter("shape")


def layout(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> Layout:
    """Fingerprint of the keys, dtypes and shapes (~0.5 µs per tensor).

    Names go through blake2b; dtype codes and shapes through Python's hash of int tuples, which is
    deterministic across processes (only str hashing is salted). The fingerprint is a fast filter:
    a difference is then confirmed, and explained, from the full metadata, so a false alarm (ranks
    on different Python versions) costs one extra exchange, never a wrong error.
    """
    dtypes = list(map(_DTYPE_OF, tensors))
    code_of = {d: CODE_OF_DTYPE.get(d, -1) for d in set(dtypes)}
    codes = tuple(map(code_of.__getitem__, dtypes))
    shapes = tuple(map(_SHAPE_OF, tensors))
    return Layout(fingerprint=fingerprint(names, codes, shapes), count=len(codes), unsupported=-1 in code_of.values())


def fingerprint(names: Sequence[str], codes: tuple[int, ...], shapes: tuple[Sequence[int], ...]) -> int:
    """The 63-bit layout fingerprint (``torch.Size`` hashes as the tuple of its dims, so either works)."""
    names_digest = hashlib.blake2b("\x1f".join(names).encode(), digest_size=8).digest()
    mixed = int.from_bytes(names_digest, "little") ^ (hash(codes) * 0x9E3779B97F4A7C15) ^ hash(shapes)
    return (mixed & ((1 << 64) - 1)) >> 1


def decode_meta(raw: bytes | bytearray) -> list[Entry]:
    """Parse metadata JSON from a peer, strictly (nothing in it is trusted).

    Every key must be a string, every dtype code one the protocol defines, every dim a non-negative
    int, and every tensor within :data:`~distinit.broadcast._bounds.MAX_TENSOR_BYTES`.

    Raises:
        ValueError: the bytes are not such a list of ``[key, dtype code, shape]`` triples.
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"state-dict metadata is not JSON ({exc})") from exc
    if not isinstance(data, list):
        raise ValueError("state-dict metadata is not a list")
    return [_entry(item) for item in data]


def _entry(item: object) -> Entry:
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and type(item[1]) is int):
        raise ValueError(f"malformed state-dict metadata entry {str(item)[:100]}")
    key, code, shape = item
    itemsize = ITEMSIZE_OF_CODE.get(code)
    if itemsize is None:
        raise ValueError(f"unknown dtype code {code} for {key[:100]!r}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"malformed shape for {key[:100]!r}")
    if math.prod(shape) * itemsize > MAX_TENSOR_BYTES:
        raise ValueError(f"{key[:100]!r} announces more than {MAX_TENSOR_BYTES} bytes")
    return key, code, tuple(shape)


def diff_metadata(metas: Sequence[list[Entry] | str | None], src: int) -> tuple[str, list[int], dict[int, str], str]:
    """Say how each rank's metadata differs from src's: (field, faulty ranks, views, detail).

    ``metas[r]``: rank ``r``'s entries, None (it passed no state dict), or a str saying why its
    metadata could not be read (a malformed or oversized blob: that rank is at fault).
    """
    ref = metas[src]
    if isinstance(ref, str):
        return "header", [src], {src: ref}, f"src rank {src} {ref}"
    ref_entries = ref or []
    views: dict[int, str] = {}
    lines: list[str] = []
    key_problem = False
    for rank, meta in enumerate(metas):
        if meta is None or rank == src:
            continue
        text, keys_differ = (meta, True) if isinstance(meta, str) else _difference(meta, ref_entries)
        if text:
            key_problem = key_problem or keys_differ
            views[rank] = text
            lines.append(f"rank {rank} {text}")
    faulty = sorted(views)
    count = f"{len(ref_entries)} tensor{'s' if len(ref_entries) != 1 else ''}"
    views[src] = f"has {count}"
    return "keys" if key_problem else "metadata", faulty, views, f"src rank {src} has {count}; " + "; ".join(lines)


def _difference(meta: list[Entry], ref: list[Entry]) -> tuple[str, bool]:
    """How ``meta`` differs from src's ``ref`` in words ("" when it does not), and whether keys differ."""
    ref_keys = {k: (c, s) for k, c, s in ref}
    mine = {k: (c, s) for k, c, s in meta}
    missing = [k for k in ref_keys if k not in mine]
    extra = [k for k in mine if k not in ref_keys]
    changed = [k for k in ref_keys if k in mine and mine[k] != ref_keys[k]]
    if not (missing or extra or changed):
        same_order = [k for k, _, _ in meta] == [k for k, _, _ in ref]
        return ("" if same_order else "lists the same tensors in another order"), False
    parts = []
    if missing:
        parts.append(f"lacks {_listed(missing)}")
    if extra:
        parts.append(f"has unexpected {_listed(extra)}")
    for k in changed[:MAX_LISTED]:
        parts.append(f"has {k!r} as {describe(*mine[k])} where src has {describe(*ref_keys[k])}")
    if len(changed) > MAX_LISTED:
        parts.append(f"(+{len(changed) - MAX_LISTED} more tensors differ in dtype or shape)")
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text, bool(missing or extra)


def _listed(keys: Sequence[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:MAX_LISTED])
    return shown + (f" (+{len(keys) - MAX_LISTED} more)" if len(keys) > MAX_LISTED else "")
