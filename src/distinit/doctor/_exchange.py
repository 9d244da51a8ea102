"""All-gather of JSON documents over a gloo group, each bounded: bytes in uint8 tensors, never pickle."""

from __future__ import annotations

import ctypes
import json
from datetime import timedelta
from typing import Any

#: The largest document one rank may contribute (a bug or a hostile peer cannot make us allocate more).
MAX_BYTES = 1 << 20

#: Every gather's work and tensors, held until :func:`destroy_world` has destroyed the group. A gloo worker
#: thread drops its reference to a finished work just after ``wait()`` returns; when that is the last one, it
#: frees the tensors, which needs the GIL. torch 2.4.1 destroys a gloo group holding the GIL while it joins
#: those threads, so a group destroyed at that moment deadlocks for good (seen: the doctor under torchrun 4
#: hung after "verdict: ok" in 2 of 3 runs). Held here, the thread's reference is never the last one.
_held: list[Any] = []


def gather_bytes(document: Any, *, world_size: int, timeout: float, group: Any = None) -> list[bytes | None]:
    """Every rank's ``document`` as the JSON bytes it sent, in rank order, within ``timeout`` per collective.

    A rank that announces a size out of bounds (0, or over :data:`MAX_BYTES`) is None in the result: every
    rank sees the same sizes, so every rank gathers the same length and reaches the same list. The bytes
    are not parsed here: the caller validates each rank's against its model.

    Raises:
        RuntimeError: a collective failed or ran out of time (torch's own error).
        ValueError: this rank's own document is over :data:`MAX_BYTES`.
    """
    import torch
    import torch.distributed as dist

    raw = json.dumps(document, separators=(",", ":")).encode()
    if len(raw) > MAX_BYTES:
        raise ValueError(f"this rank's document is {len(raw)} bytes, over {MAX_BYTES}")
    bound = timedelta(seconds=timeout)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    size = torch.tensor([len(raw)], dtype=torch.int64)
    work = dist.all_gather(sizes, size, group=group, async_op=True)
    _held.append((work, sizes, size))
    work.wait(bound)
    announced = [int(s.item()) for s in sizes]
    longest = max([n for n in announced if 1 <= n <= MAX_BYTES], default=1)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    gathered = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world_size)]
    work = dist.all_gather(gathered, mine, group=group, async_op=True)
    _held.append((work, gathered, mine))
    work.wait(bound)
    return [_bytes_of(t[:n]) if 1 <= n <= MAX_BYTES else None for t, n in zip(gathered, announced, strict=True)]


def destroy_world() -> None:
    """Destroy the default group, then let go of the gathers' works and tensors (see :data:`_held`)."""
    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    finally:
        _held.clear()


def _bytes_of(tensor: Any) -> bytes:
    """The bytes of a contiguous CPU uint8 tensor, read without numpy.

    torch does not require numpy, so ``.numpy()`` fails on a clean install (``Numpy is not available``).
    """
    return ctypes.string_at(tensor.data_ptr(), tensor.numel())


def gather_json(document: Any, *, world_size: int, timeout: float, group: Any = None) -> list[Any]:
    """Every rank's ``document`` parsed, in rank order (for trusted callers; the doctor validates bytes).

    Raises:
        RuntimeError: a collective failed or ran out of time (torch's own error).
        ValueError: a document is over :data:`MAX_BYTES`, announced out of bounds, or not JSON.
    """
    found = gather_bytes(document, world_size=world_size, timeout=timeout, group=group)
    bad = [rank for rank, raw in enumerate(found) if raw is None]
    if bad:
        raise ValueError(f"rank(s) {bad} announced a document size out of bounds (1..{MAX_BYTES} bytes)")
    return [json.loads(raw or b"") for raw in found]
