"""All-gather of JSON documents over a gloo group, each bounded: bytes in uint8 tensors, never pickle."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

#: The largest document one rank may contribute (a bug or a hostile peer cannot make us allocate more).
MAX_BYTES = 1 << 20


def gather_json(document: Any, *, world_size: int, timeout: float, group: Any = None) -> list[Any]:
    """Every rank's ``document``, in rank order, within ``timeout`` seconds per collective.

    Raises:
        RuntimeError: a collective failed or ran out of time (torch's own error).
        ValueError: a document is over :data:`MAX_BYTES` or not JSON.
    """
    import torch
    import torch.distributed as dist

    raw = json.dumps(document, separators=(",", ":")).encode()
    if len(raw) > MAX_BYTES:
        raise ValueError(f"this rank's document is {len(raw)} bytes, over {MAX_BYTES}")
    bound = timedelta(seconds=timeout)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(raw)], dtype=torch.int64), group=group, async_op=True).wait(bound)
    longest = max(int(s.item()) for s in sizes)
    if longest > MAX_BYTES or longest < 1:
        raise ValueError(f"a rank announced a {longest}-byte document (limit {MAX_BYTES})")
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    gathered = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(gathered, mine, group=group, async_op=True).wait(bound)
    return [json.loads(bytes(t[: int(n.item())].tolist())) for t, n in zip(gathered, sizes, strict=True)]
