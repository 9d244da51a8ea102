"""A world of one rank (issue 27): every entry point checks its own input and returns as before, with no collective.

Collectives are counted by torch's profiler, which records each gloo collective (``gloo:*``) a rank runs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from distinit.testing import DistWorld


def _gloo_ops(fn: Any) -> tuple[Any, dict[str, int]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = fn()
    return got, dict(Counter(e.name for e in prof.events() if e.name.startswith("gloo:")))


def every_entry_point_alone(tmp: str) -> dict[str, Any]:
    """Each call's result facts and the collectives it ran, then the errors a bad argument still gets."""
    from distinit.broadcast import (
        broadcast_module,
        broadcast_object,
        broadcast_state_dict,
        broadcast_tensor,
        flatten_module_,
    )
    from distinit.errors import BroadcastMismatchError

    small, big = torch.arange(10.0), torch.arange(1 << 20, dtype=torch.int32)
    sd = {"w": torch.randn(300, 300), "b": torch.zeros(3, dtype=torch.bfloat16)}
    model = torch.nn.Linear(64, 64)
    flat = torch.nn.Linear(8, 8)
    flatten_module_(flat)
    calls = {
        "tensor inline": lambda: broadcast_tensor(small) is small,
        "tensor 4 MiB": lambda: broadcast_tensor(big) is big,
        "tensor auto": lambda: broadcast_tensor(big, via="auto", zero_copy=True) is big,
        "tensor shm": lambda: torch.equal(broadcast_tensor(big, via="shm"), big),
        "object": lambda: broadcast_object({"lr": 0.1, "tags": ["a"] * 2000}, type=dict[str, Any]) is not None,
        "state_dict": lambda: broadcast_state_dict(sd) == sd,
        "module": lambda: broadcast_module(model) is None,
        "module flattened": lambda: broadcast_module(flat) is None,
    }
    out: dict[str, Any] = {}
    for name, call in calls.items():
        ok, ops = _gloo_ops(call)
        out[name] = [bool(ok), ops]
    got = broadcast_tensor(big, via="file", path=tmp, keep=True)  # a file is still written: keep= leaves it
    out["file keep"] = [got is big or torch.equal(got, big), {}]
    errors = {}
    for name, bad in {
        "src passes None": lambda: broadcast_tensor(None),
        "src outside the group": lambda: broadcast_tensor(small, src=1),
        "object that does not serialise": lambda: broadcast_object(object(), type=int),
    }.items():
        try:
            bad()
            errors[name] = "no error"
        except BroadcastMismatchError as exc:
            errors[name] = exc.field
    out["errors"] = errors
    return out


@pytest.mark.timeout(120)
def test_a_world_of_one_runs_no_collective_and_still_checks_its_input(dist_world: DistWorld, tmp_path: Any) -> None:
    (got,) = dist_world(every_entry_point_alone, world_size=1, timeout=90, args=(str(tmp_path),))
    errors = got.pop("errors")
    assert errors == {
        "src passes None": "argument",
        "src outside the group": "src",
        "object that does not serialise": "argument",
    }
    assert got == {name: [True, {}] for name in got}, got
    assert any(p.name.startswith("distinit-bc-") for p in tmp_path.iterdir())  # keep=True: the file stays
