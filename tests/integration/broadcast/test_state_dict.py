"""broadcast_state_dict and broadcast_module on real gloo groups: packing, in-place, tied weights, key checks."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from distinit.testing import DistWorld


def _state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {
        "big.weight": torch.randn(600, 600, generator=g),  # 1.4 MB: sent in place
        "emb.weight": torch.randn(300, 1000, generator=g).to(torch.bfloat16),
        "mask": torch.randint(0, 2, (17,), generator=g).bool(),
        "step": torch.tensor(seed, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "codes": torch.randint(0, 60000, (33,), generator=g).to(torch.uint16),
        "fp8": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
    }
    for i in range(300):  # many small tensors: packed into buckets; metadata > 4 KiB: sent out of band
        sd[f"layers.{i}.bias"] = torch.randn(10, generator=g)
    return sd


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
        for k in a
    )


def state_dict_round_trips() -> list[str]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict

    rank, failures = dist.get_rank(), []
    ref = _state_dict(0)
    got = broadcast_state_dict(ref if rank == 0 else None)  # receivers allocate from src's metadata
    if not _same(got, ref):
        failures.append("allocated")
    mine = _state_dict(rank)  # same keys, other values: filled in place
    before = {k: v.data_ptr() for k, v in mine.items()}
    got = broadcast_state_dict(mine, bucket_bytes=4096)
    if not _same(got, ref) or not _same(mine, ref) or any(v.data_ptr() != before[k] for k, v in mine.items()):
        failures.append("in place")
    small = {"a": torch.ones(2)}
    if not _same(broadcast_state_dict(small if rank == 0 else None), small):
        failures.append("inline metadata")
    # Conjugate / negative views (in place >= 1 MiB, and packed): values arrive, never their raw memory.
    values = {"big": torch.arange(200_000.0).to(torch.complex64) * (1 + 2j), "small": torch.ones(3) * (2 - 1j)}
    expected = {k: v.conj().resolve_conj() for k, v in values.items()}
    views = {k: (v.clone() if rank == 0 else torch.zeros_like(v)).conj() for k, v in values.items()}
    got = broadcast_state_dict(views)
    if not all(torch.equal(got[k], expected[k]) and torch.equal(views[k], expected[k]) for k in values):
        failures.append("conjugate views")
    return failures


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_state_dict_round_trips_bit_exactly(dist_world: DistWorld, world_size: int) -> None:
    assert dist_world(state_dict_round_trips, world_size=world_size, timeout=45) == [[]] * world_size


def mixed_receivers() -> list[str]:
    """One receiver allocates from src's metadata (> 4 KiB: its own broadcast), another fills its own dict."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict

    rank, ref = dist.get_rank(), _state_dict(0)
    mine = {0: ref, 1: None, 2: _state_dict(2)}[rank]
    got = broadcast_state_dict(mine, timeout=20)
    again = broadcast_state_dict(mine if rank != 1 else None, timeout=20)  # and the group is still in step
    return [] if _same(got, ref) and _same(again, ref) else [f"rank {rank} got other tensors"]


@pytest.mark.timeout(60)
def test_receivers_that_allocate_and_receivers_with_buffers_mix(dist_world: DistWorld) -> None:
    # Before, receivers passing a state dict skipped the metadata broadcast the others joined.
    assert dist_world(mixed_receivers, world_size=3, timeout=45) == [[], [], []]


def state_dict_mismatches() -> list[tuple[str, str, str, float]]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict
    from distinit.errors import BroadcastMismatchError

    rank, last = dist.get_rank(), dist.get_world_size() - 1
    base = {"encoder.weight": torch.zeros(4, 3), "encoder.bias": torch.zeros(4), "head.weight": torch.zeros(2, 4)}
    cases = {
        "missing-and-extra-key": {**base, "head.bias": torch.zeros(2)} if rank == last else base,
        "ddp-prefix": {f"module.{k}": v for k, v in base.items()} if rank == last else base,
        "transposed-weight": {**base, "encoder.weight": torch.zeros(3, 4)} if rank == last else base,
        "dtype": {**base, "encoder.bias": torch.zeros(4, dtype=torch.float16)} if rank == last else base,
        "not-a-state-dict": [1, 2] if rank == last else base,
    }
    out = []
    for case, sd in cases.items():
        start = time.monotonic()
        try:
            broadcast_state_dict(sd)  # type: ignore[arg-type]
            out.append((case, "no error", "", time.monotonic() - start))
        except BroadcastMismatchError as exc:
            out.append((case, exc.field, str(exc), time.monotonic() - start))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_state_dict_mismatch_names_the_keys_on_every_rank(dist_world: DistWorld, world_size: int) -> None:
    per_rank = dist_world(state_dict_mismatches, world_size=world_size, timeout=45)
    expected = ["keys", "keys", "metadata", "metadata", "argument"]
    for index, field in enumerate(expected):
        rows = [seen[index] for seen in per_rank]
        assert {row[1] for row in rows} == {field}, rows[0]
        assert len({row[2] for row in rows}) == 1
        assert max(row[3] for row in rows) < 2.0
    last = world_size - 1
    assert f"rank {last} has unexpected 'head.bias'" in per_rank[0][0][2]
    assert "lacks 'encoder.weight'" in per_rank[0][1][2]
    assert "'module.' prefix" in per_rank[0][1][2]
    assert "'encoder.weight' as float32[3, 4] where src has float32[4, 3]" in per_rank[0][2][2]


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.again = self.block  # the same submodule twice
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight  # tied weights
        self.register_buffer("position", torch.arange(16))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


def module_sync() -> list[str]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_module

    rank = dist.get_rank()
    torch.manual_seed(rank)  # every rank starts from different weights
    model = Tied()
    model.block[1].running_mean.fill_(rank)
    model.block[1].num_batches_tracked.fill_(rank + 5)
    model.scratch.fill_(rank)
    broadcast_module(model)
    torch.manual_seed(0)
    ref = Tied()
    ref.block[1].running_mean.fill_(0)
    ref.block[1].num_batches_tracked.fill_(5)
    failures = [
        name
        for name, tensor in [*ref.named_parameters(), *ref.named_buffers()]
        if not torch.equal(tensor, dict([*model.named_parameters(), *model.named_buffers()])[name])
    ]
    if model.head.weight is not model.embed.weight:
        failures.append("tie broken")
    if not model.embed.weight.requires_grad:
        failures.append("requires_grad lost")
    return failures


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_module_parameters_and_buffers_sync_in_place(dist_world: DistWorld, world_size: int) -> None:
    assert dist_world(module_sync, world_size=world_size, timeout=45) == [[]] * world_size


def module_mismatch(flatten: bool) -> tuple[str, str]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_module, flatten_module_
    from distinit.errors import BroadcastMismatchError

    hidden = 32 if dist.get_rank() == 1 else 16  # a config that differs on one rank
    model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Linear(hidden, 2))
    if flatten:  # flattened models are verified all the same
        flatten_module_(model)
    try:
        broadcast_module(model)
    except BroadcastMismatchError as exc:
        return exc.field, str(exc)
    return "no error", ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flatten", [False, True], ids=["staged", "flattened"])
def test_module_structure_mismatch(dist_world: DistWorld, flatten: bool) -> None:
    per_rank = dist_world(module_mismatch, world_size=3, timeout=30, args=(flatten,))
    assert len(set(per_rank)) == 1
    field, text = per_rank[0]
    assert field == "metadata"
    assert "rank 1 has '0.weight' as float32[32, 8] where src has float32[16, 8]" in text


def subgroup_state_dict() -> list[float]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict

    rank = dist.get_rank()
    group = dist.new_group([0, 2])
    if rank == 1:
        return []
    sd = broadcast_state_dict({"w": torch.full((3,), 7.0)} if rank == 2 else None, src=1, group=group)
    return sd["w"].tolist()


@pytest.mark.timeout(60)
def test_state_dict_over_a_subgroup(dist_world: DistWorld) -> None:
    assert dist_world(subgroup_state_dict, world_size=3, timeout=30) == [[7.0] * 3, [], [7.0] * 3]


class _Paths(logging.Handler):
    """Which transfer path each broadcast_module call took on this rank (from the debug record)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.flat: list[bool] = []

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, "distinit", {})
        if info.get("event") == "broadcast.call" and info.get("call") == "broadcast_module":
            self.flat.append(bool(info.get("flat")))


def _seeded(rank: int) -> Tied:
    torch.manual_seed(rank)  # every rank starts from different weights
    model = Tied()
    model.block[1].running_mean.fill_(rank)
    model.block[1].num_batches_tracked.fill_(rank + 5)
    return model


def _differences(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> list[str]:
    got = dict([*model.named_parameters(), *model.named_buffers()])
    return [name for name, value in expected.items() if not torch.equal(got[name], value)]


def flattened_module_sync() -> dict[str, object]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_module, flatten_module_

    rank, last = dist.get_rank(), dist.get_world_size() - 1
    logger = logging.getLogger("distinit.broadcast")
    paths, level = _Paths(), logger.level
    logger.addHandler(paths)
    logger.setLevel(logging.DEBUG)
    out: dict[str, object] = {}
    try:
        reference = {k: v.detach().clone() for k, v in [*_seeded(0).named_parameters(), *_seeded(0).named_buffers()]}
        model = _seeded(rank)
        flatten_module_(model)
        broadcast_module(model)
        out["all flattened"] = (_differences(model, reference), model.head.weight is model.embed.weight)
        # A parameter replaced after flattening (same shape) no longer aliases the flat buffer, on src and on
        # a receiver: the call stays on the flat path and its values still arrive.
        if rank == 0:
            model.block[0].bias = torch.nn.Parameter(torch.full((16,), 7.0))
            with torch.no_grad():
                model.block[0].weight.fill_(3.0)
        if rank == last:
            model.block[0].weight = torch.nn.Parameter(torch.zeros(16, 16))
        broadcast_module(model)
        out["replaced"] = (
            bool(torch.equal(model.block[0].weight, torch.full((16, 16), 3.0))),
            bool(torch.equal(model.block[0].bias, torch.full((16,), 7.0))),
        )
        # A rank whose model is not flattened sends every rank down the staged path.
        other = _seeded(rank)
        if rank != last:
            flatten_module_(other)
        broadcast_module(other)
        out["one rank not flattened"] = _differences(other, reference)
        # A model changed after flattening (another dtype) no longer matches its flat state: staged path.
        moved = _seeded(rank)
        flatten_module_(moved)
        moved.double()
        broadcast_module(moved)
        expected = {k: v.double() if v.is_floating_point() else v for k, v in reference.items()}
        out["changed after flattening"] = _differences(moved, expected)
        out["paths"] = paths.flat
    finally:
        logger.removeHandler(paths)
        logger.setLevel(level)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_flattened_modules_move_zero_copy_and_fall_back_when_they_must(dist_world: DistWorld, world_size: int) -> None:
    for result in dist_world(flattened_module_sync, world_size=world_size, timeout=45):
        assert result["all flattened"] == ([], True)
        assert result["replaced"] == (True, True)
        assert result["one rank not flattened"] == []
        assert result["changed after flattening"] == []
        assert result["paths"] == [True, True, False, False]
