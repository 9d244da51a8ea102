"""One task of a shm/file broadcast under a real launcher: ``setup()``, then the same state dict through
``via="shm"`` (and ``zero_copy``) and ``via="file"`` (``path`` = argv[1]). Prints one JSON line with a
digest of what arrived, the network fallbacks logged."""

from __future__ import annotations

import hashlib
import json
import logging
import sys

import torch

import distinit


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    torch.set_num_threads(1)
    fallbacks: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            payload = getattr(record, "distinit", None)
            if isinstance(payload, dict) and payload.get("event") == "broadcast.via_fallback":
                fallbacks.append(record.getMessage())

    logging.getLogger("distinit").addHandler(Capture())
    env = distinit.setup("gloo", deadline=60, attempt_timeout=30).env
    gen = torch.Generator().manual_seed(7)
    source = {f"w{i}": torch.randn(1 << 16, generator=gen) for i in range(8)} | {"step": torch.tensor([3])}
    mine = source if env.rank == 0 else None
    shm = distinit.broadcast_state_dict(mine, via="shm", timeout=60)
    zero = distinit.broadcast_state_dict(mine, via="shm", zero_copy=True, timeout=60)
    filed = distinit.broadcast_state_dict(mine, via="file", path=sys.argv[1], timeout=60)
    record = {
        "rank": env.rank,
        "node_rank": env.node_rank,
        "want": digest(source),
        "shm": digest(shm),
        "zero_copy": digest(zero),
        "file": digest(filed),
        "fallbacks": fallbacks,
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
