"""A hostile doctor peer: joins the doctor's gloo group as its rank, then sends a bad first document.

Usage: ``python hostile_peer.py MODE`` with the env:// variables of its rank. It speaks the doctor's wire
protocol (a size all_gather, then a bytes all_gather) and lies in the document: see :data:`DOCUMENTS`.
It prints ``sent MODE`` and exits 0 once the exchange is done.
"""

from __future__ import annotations

import json
import socket
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distinit.doctor._exchange import MAX_BYTES
from distinit.env import env_from_scheduler
from distinit.init import init_with_retry


def _claim(rank: int) -> dict[str, Any]:
    return {"rank": rank, "identity": {"hostname": socket.gethostname()}}


def _honest(rank: int) -> dict[str, Any]:
    facts = {"versions": {}, "backends": {}, "variables": {}, "digest": "0"}
    return {"claim": _claim(rank), "facts": facts, "local": [], "cuda_device": None, "endpoint": ["127.0.0.1", 9]}


def document(mode: str, rank: int) -> bytes | int:
    """The bytes this mode sends, or (an int) the size it announces without sending a document of that size."""
    bad: dict[str, Any] = {
        "facts-list": {**_honest(rank), "facts": ["torch", "2.13"]},
        "local-string": {**_honest(rank), "local": "all good"},
        "port": {**_honest(rank), "endpoint": ["127.0.0.1", 10**12]},
        "wrong-shape": [1, 2, 3],
        "rank-out-of-world": {**_honest(rank), "claim": _claim(10**6)},
    }
    if mode in bad:
        return json.dumps(bad[mode]).encode()
    if mode == "nested":
        return b"[" * 100_000 + b"]" * 100_000
    if mode == "huge-size":
        return 10**12
    raise SystemExit(f"unknown mode {mode!r}")


def main(mode: str) -> int:
    env = env_from_scheduler()
    init_with_retry("gloo", env=env, deadline=60, attempt_timeout=30, pg_timeout=30, verify=False)
    raw = document(mode, env.rank)
    announced = raw if isinstance(raw, int) else len(raw)
    bound = timedelta(seconds=30)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(env.world_size)]
    dist.all_gather(sizes, torch.tensor([announced], dtype=torch.int64), async_op=True).wait(bound)
    longest = max([n for s in sizes if 1 <= (n := int(s.item())) <= MAX_BYTES], default=1)
    mine = torch.zeros(longest, dtype=torch.uint8)
    if isinstance(raw, bytes):
        mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    gathered = [torch.zeros(longest, dtype=torch.uint8) for _ in range(env.world_size)]
    dist.all_gather(gathered, mine, async_op=True).wait(bound)
    dist.destroy_process_group()
    print(f"sent {mode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
