"""``via="auto"``'s route on real gloo groups: settled by the header alone unless some rank asked for zero_copy.

Collectives are counted by torch's profiler, which records each gloo collective a rank runs (``gloo:all_to_all``,
``gloo:all_gather``, ``gloo:broadcast``); the route by the ``broadcast.route`` log event every rank emits.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
import torch

from distinit.testing import DistWorld

MIB = 1 << 20
CASES = {  # name: (payload bytes, the ranks that ask for zero_copy)
    "nobody asks zero_copy, 16 MiB": (16 * MIB, ()),
    "one receiver asks zero_copy, 1 MiB": (1 * MIB, (1,)),
    "one receiver asks zero_copy, 16 MiB": (16 * MIB, (2,)),
    "src asks zero_copy, 16 MiB": (16 * MIB, (0,)),
}


class _Routes(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.routes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        facts = getattr(record, "distinit", None)
        if isinstance(facts, dict) and facts.get("event") == "broadcast.route":
            self.routes.append(str(facts["route"]))


def auto_calls() -> dict[str, Any]:
    """Every case once: this rank's collectives, route and whether the payload arrived."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor

    rank, seen = dist.get_rank(), {}
    handler, logger = _Routes(), logging.getLogger("distinit.broadcast")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        for name, (nbytes, asking) in CASES.items():
            ref = torch.arange(nbytes // 4, dtype=torch.int32)
            handler.routes.clear()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                got = broadcast_tensor(ref if rank == 0 else None, via="auto", zero_copy=rank in asking, timeout=60)
            counts = Counter(e.name for e in prof.events() if e.name.startswith("gloo:"))
            seen[name] = {"collectives": dict(counts), "routes": list(handler.routes), "equal": torch.equal(got, ref)}
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    return seen


@pytest.mark.timeout(150)
@pytest.mark.parametrize("digest_from", [None, "2"], ids=["row-exchange", "digest"])
def test_auto_decides_alike_on_every_rank_and_gathers_only_when_a_rank_asked_for_zero_copy(
    dist_world: DistWorld, digest_from: str | None
) -> None:
    env = {"DISTINIT_BROADCAST_DIGEST_FROM": digest_from} if digest_from else None
    per_rank = dist_world(auto_calls, world_size=3, timeout=120, env=env)
    for name, (nbytes, asking) in CASES.items():
        rows = [seen[name] for seen in per_rank]
        assert all(row["equal"] for row in rows), (name, rows)
        assert all(row["routes"] == ["network"] for row in rows), (name, rows)  # 3 ranks on a host: below auto's 4
        agreement = bool(asking) and nbytes >= 16 * MIB  # else the header decided: no collective of auto's own
        if digest_from:  # the header: the digest's tree of sends toward rank 0, then its broadcast
            expected = {"gloo:all_gather": 1} if agreement else {}
            assert all({k: v for k, v in row["collectives"].items() if k not in ("gloo:send", "gloo:recv")}
                       == {"gloo:broadcast": 2, **expected} for row in rows), (name, rows)  # fmt: skip
        else:
            expected = {"gloo:all_to_all": 1, "gloo:broadcast": 1, **({"gloo:all_gather": 1} if agreement else {})}
            assert all(row["collectives"] == expected for row in rows), (name, rows)
