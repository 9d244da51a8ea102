"""How a list of tensors is cut into collectives: large ones in place, small ones packed in buckets.

Pure, so every rank derives the same plan from the same (verified) metadata, and it can be
unit-tested. The defaults come from ``benchmarks/bench_broadcast.py`` (see docs/broadcast.md):
per-tensor collectives cost ~0.1 ms each on gloo, so thousands of small tensors must be packed,
while packing a large tensor costs a copy that in-place sending avoids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

DEFAULT_BUCKET_BYTES = 4 << 20
"""Small tensors are packed into buckets of at most this many bytes."""
DEFAULT_DIRECT_BYTES = 1 << 20
"""Tensors of at least this many bytes are sent in place, one collective each (no copy)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective: a single tensor sent in place (``direct``) or a packed bucket of several."""

    indices: tuple[int, ...]
    nbytes: int
    direct: bool


def plan(
    nbytes: Sequence[int], *, bucket_bytes: int, direct_bytes: int, dtypes: Sequence[object] | None = None
) -> list[Step]:
    """Cut tensors of the given sizes into collectives, preserving order within buckets.

    A tensor of at least ``direct_bytes`` (or one that would not fit a bucket) gets its own
    in-place step; the others fill buckets of at most ``bucket_bytes`` in order. Buckets hold a
    single dtype (``dtypes[i]``, any hashable) so they pack and unpack with torch's C++ flatten
    helpers. Empty tensors move no bytes and are left out.
    """
    steps: list[Step] = []
    pending: dict[object, tuple[list[int], int]] = {}
    for index, size in enumerate(nbytes):
        if size == 0:
            continue
        if size >= direct_bytes or size >= bucket_bytes:
            steps.append(Step((index,), size, True))
            continue
        key = dtypes[index] if dtypes is not None else None
        indices, total = pending.get(key, ([], 0))
        if indices and total + size > bucket_bytes:
            steps.append(Step(tuple(indices), total, False))
            indices, total = [], 0
        indices.append(index)
        pending[key] = (indices, total + size)
    steps.extend(Step(tuple(indices), total, False) for indices, total in pending.values() if indices)
    return steps
