"""broadcast_object on real gloo groups: typed round trips, schema mismatches, hostile payloads."""

from __future__ import annotations

import dataclasses
import time

import pydantic
import pytest
import torch
from typing_extensions import TypedDict

from distinit.testing import DistWorld


class Optim(pydantic.BaseModel):
    name: str = "adamw"
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)


class TrainConfig(pydantic.BaseModel):
    run: str
    steps: int
    optim: Optim
    layers: list[int] = []
    tags: dict[str, str] = {}


class TrainConfigV2(pydantic.BaseModel):  # the same model one release later: a field was added
    run: str
    steps: int
    optim: Optim
    layers: list[int] = []
    tags: dict[str, str] = {}
    warmup: int = 0


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Sizes(TypedDict):
    width: int
    height: int


class WithTensors(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    name: str
    weight: torch.Tensor
    extra: list[torch.Tensor]


CONFIG = TrainConfig(run="r1", steps=10, optim=Optim(lr=0.1), layers=[1, 2, 3], tags={"a": "b"})
BIG = TrainConfig(run="x" * 20_000, steps=1, optim=Optim(lr=1.0))  # > 4 KiB: a second collective


def round_trips() -> list[str]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object

    src = dist.get_rank() == 0
    failures = []
    cases: list[tuple[object, object]] = [
        (CONFIG, TrainConfig),
        (BIG, TrainConfig),
        ([CONFIG, CONFIG], list[TrainConfig]),
        ({"p": Point(1, 2.5)}, dict[str, Point]),
        (Sizes(width=3, height=4), Sizes),
        (42, int),
        ("text", str),
        (None, int | None),
    ]
    for value, tp in cases:
        got = broadcast_object(value if src else None, type=tp)
        if got != value:
            failures.append(f"{tp}: {got!r}")
    weight = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    holder = WithTensors(name="w", weight=weight, extra=[torch.ones(3, dtype=torch.int16), torch.zeros(0)])
    got = broadcast_object(holder if src else None, type=WithTensors)
    if not (
        torch.equal(got.weight, weight) and got.weight.dtype == torch.bfloat16 and got.extra[0].dtype == torch.int16
    ):
        failures.append(f"tensors: {got!r}")
    return failures


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_typed_objects_round_trip(dist_world: DistWorld, world_size: int) -> None:
    assert dist_world(round_trips, world_size=world_size, timeout=45) == [[]] * world_size


def schema_mismatches() -> list[tuple[str, str, float]]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object
    from distinit.errors import BroadcastMismatchError

    rank, last = dist.get_rank(), dist.get_world_size() - 1
    out = []
    cases = {
        "older-model-on-one-rank": dict(value=CONFIG, type=TrainConfigV2 if rank == last else TrainConfig),
        "src-object-of-wrong-type": dict(value="not a config", type=TrainConfig),
        "src-disagreement": dict(value=CONFIG, type=TrainConfig, src=rank),
    }
    for case, kw in cases.items():
        start = time.monotonic()
        try:
            value = kw.pop("value")
            broadcast_object(value if rank == 0 else None, **kw)  # type: ignore[call-overload]
            out.append((case, "no error", time.monotonic() - start))
        except BroadcastMismatchError as exc:
            out.append((case, f"{exc.field}|{exc}", time.monotonic() - start))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_schema_mismatch_raises_on_every_rank(dist_world: DistWorld, world_size: int) -> None:
    per_rank = dist_world(schema_mismatches, world_size=world_size, timeout=45)
    expected = ["schema", "argument", "src"]
    for index, field in enumerate(expected):
        rows = [seen[index] for seen in per_rank]
        assert len({row[1] for row in rows}) == 1, rows
        assert rows[0][1].startswith(field + "|")
        assert max(row[2] for row in rows) < 2.0
    assert f"rank {world_size - 1} gave a type= with schema fingerprint" in per_rank[0][0][1]


HOSTILE = {
    "truncated": b'{"run": "r", "steps": 1',
    "wrong-types": b'{"run": 1, "steps": "many", "optim": {"lr": "fast"}}',
    "pickle-opcodes": b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.",
    "class-smuggling": b'{"__class__": "os.system", "__reduce__": ["rm", "-rf"], "run": "r", "steps": 1}',
    "bad-tensor-marker": b'{"name": "w", "weight": {"__distinit_tensor__": 5, "dtype": 1, "shape": [2]}, "extra": []}',
}


def hostile_payloads() -> list[tuple[str, str]]:
    import torch.distributed as dist

    from distinit.broadcast import _object, broadcast_object
    from distinit.errors import BroadcastMismatchError

    rank = dist.get_rank()
    out = []
    for case, payload in HOSTILE.items():
        tp = WithTensors if case == "bad-tensor-marker" else TrainConfig
        if rank == 0:  # a peer that sends bytes of its own making instead of pydantic's JSON
            count = 1 if case == "bad-tensor-marker" else 0
            _object.encode = lambda obj, tp, p=payload, n=count: (p, [torch.zeros(2)] * n)  # type: ignore[assignment]
        try:
            broadcast_object(CONFIG if rank == 0 else None, type=tp)
            out.append((case, "accepted"))
        except BroadcastMismatchError as exc:
            out.append((case, exc.field))
    return out


@pytest.mark.timeout(60)
def test_hostile_payloads_fail_validation_on_receivers(dist_world: DistWorld) -> None:
    src, *receivers = dist_world(hostile_payloads, world_size=3, timeout=45)
    assert [field for _, field in src] == ["accepted"] * len(HOSTILE)  # src itself sent happily
    for seen in receivers:
        assert [field for _, field in seen] == ["payload"] * len(HOSTILE), seen
