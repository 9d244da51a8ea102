"""The CUDA and NCCL paths of set-up and broadcast, on real process groups.

Each scenario is parametrized by device: the ``cpu`` run checks the scenario itself on every machine
(CI has no GPU), the ``cuda`` run is the point and skips without a CUDA device. One GPU is enough: NCCL
runs as a world of one (NCCL refuses two ranks on one device), gloo runs two ranks that share the GPU
(gloo stages CUDA tensors through host memory).
"""

from __future__ import annotations

import os

import pytest
import torch

from distinit.testing import DistWorld

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA)]


def _backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def setup_and_verify(device: str) -> dict[str, object]:
    """``setup()`` forms the group (NCCL with device_id on CUDA) and verifies the world with one all_gather."""
    import torch.distributed as dist

    from distinit import setup, teardown

    result = setup(_backend(device), deadline=60, attempt_timeout=30)
    try:
        x = torch.ones(3, device=result.device)
        dist.all_reduce(x)
        world = result.report.world
        return {
            "backend": dist.get_backend(),
            "device": result.device,
            "sum": x.cpu().tolist(),
            "node_rank": result.env.node_rank,
            "num_nodes": result.env.num_nodes,
            "local_world_size": result.env.local_world_size,
            "verified": world is not None,
        }
    finally:
        teardown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", DEVICES)
def test_setup_verifies_the_world_on_the_backend_of_the_device(dist_world: DistWorld, device: str) -> None:
    (got,) = dist_world(setup_and_verify, world_size=1, init=False, timeout=90, args=(device,))
    assert got == {
        "backend": _backend(device),
        "device": "cuda:0" if device == "cuda" else "cpu",
        "sum": [1.0, 1.0, 1.0],
        "node_rank": 0,
        "num_nodes": 1,
        "local_world_size": 1,
        "verified": True,
    }


def _state(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    cpu = {
        "w": torch.randn(300, 301, generator=g),
        "half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "mask": torch.randint(0, 2, (17,), generator=g).bool(),
        "step": torch.tensor(11),
        "tiny": torch.arange(5, dtype=torch.int16),
    }
    return {k: v.to(device) for k, v in cpu.items()}


def digest_path_round_trip(device: str) -> list[bool]:
    """The header digest (forced from one rank) on the group's own backend: NCCL all_reduce on CUDA."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object, broadcast_state_dict, broadcast_tensor

    if device == "cuda":
        torch.cuda.set_device(0)
    rank = dist.get_rank()
    want = _state(device)
    got = broadcast_state_dict(want if rank == 0 else None, device=device)
    big = torch.arange(1 << 20, dtype=torch.float32, device=device)
    t = broadcast_tensor(big if rank == 0 else None, device=device)
    return [
        list(got) == list(want),
        all(torch.equal(got[k].cpu(), want[k].cpu()) and got[k].device.type == device for k in want),
        torch.equal(t.cpu(), big.cpu()) and t.device.type == device,
        broadcast_object({"lr": 0.1} if rank == 0 else None, type=dict[str, float]) == {"lr": 0.1},
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", DEVICES)
def test_header_digest_on_the_groups_backend(dist_world: DistWorld, device: str) -> None:
    env = {"DISTINIT_BROADCAST_DIGEST_FROM": "1"}
    got = dist_world(
        digest_path_round_trip, world_size=1, backend=_backend(device), env=env, timeout=90, args=(device,)
    )
    assert got == [[True, True, True, True]]


def transports_from_device(device: str) -> list[list[object]]:
    """Every transport (network, shm, shm zero-copy, file) from a tensor on ``device``, two ranks sharing it."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict, broadcast_tensor

    rank = dist.get_rank()
    src = (torch.arange(3 << 20, dtype=torch.int32) * 3).to(device)  # 12 MiB: past every inline limit
    folder = os.environ["CUDA_PATHS_DIR"]
    out: list[list[object]] = []
    for via, zero_copy in (("network", False), ("shm", False), ("shm", True), ("file", False)):
        path = folder if via == "file" else None
        got = broadcast_tensor(src if rank == 0 else None, device=device, via=via, zero_copy=zero_copy, path=path)
        out.append([via, zero_copy, got.device.type, bool(torch.equal(got.cpu(), src.cpu()))])
    want = _state(device)
    sd = broadcast_state_dict(want if rank == 0 else None, device=device, via="shm")
    out.append(
        ["state_dict shm", False, sd["w"].device.type, all(torch.equal(sd[k].cpu(), want[k].cpu()) for k in want)]
    )
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", DEVICES)
def test_transports_carry_tensors_of_the_device(dist_world: DistWorld, device: str, tmp_path: os.PathLike[str]) -> None:
    env = {"CUDA_PATHS_DIR": str(tmp_path)}
    got = dist_world(transports_from_device, world_size=2, env=env, timeout=150, args=(device,))
    want = [
        ["network", False, device, True],
        ["shm", False, device, True],
        ["shm", True, device, True],
        ["file", False, device, True],
        ["state_dict shm", False, device, True],
    ]
    assert got == [want, want]
    assert [p for p in os.listdir(tmp_path) if not p.startswith(".")] == []


def setup_on_a_crowded_host() -> str:
    from distinit import setup
    from distinit.errors import ConflictingEnvError

    try:
        setup(deadline=30, attempt_timeout=10)  # no backend named: the choice must not mix NCCL and gloo
    except ConflictingEnvError as exc:
        return str(exc)
    return "formed"


@pytest.mark.timeout(120)
@CUDA
def test_setup_refuses_more_ranks_on_a_host_than_gpus(dist_world: DistWorld) -> None:
    """One rank more than GPUs: before, local rank 0 chose NCCL and the others gloo, and all waited out the timeout."""
    world = torch.cuda.device_count() + 1
    got = dist_world(setup_on_a_crowded_host, world_size=world, init=False, timeout=60)
    assert all(f"{world} ranks on this host" in text and "--nproc-per-node=" in text for text in got), got


def receivers_allocate_once(device: str) -> list[object]:
    """Receivers passing None with via="auto" (the network after all): one allocation each, on ``device``."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_state_dict, broadcast_tensor

    rank = dist.get_rank()
    payload = torch.arange(4 << 20, dtype=torch.int32).to(device)  # 16 MiB
    want = {"w": payload, "b": payload[:1000].clone()}
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if device == "cuda" else 0
    got = broadcast_tensor(payload if rank == 0 else None, device=device, via="auto", zero_copy=rank == 1)
    sd = broadcast_state_dict(want if rank == 0 else None, device=torch.device(device), via="auto")
    grown = (torch.cuda.max_memory_allocated() - before) if device == "cuda" else 0
    received = payload.nbytes + sum(t.nbytes for t in want.values())
    return [
        bool(torch.equal(got.cpu(), payload.cpu())) and got.device.type == device,
        all(torch.equal(sd[k].cpu(), want[k].cpu()) and sd[k].device.type == device for k in want),
        rank == 0 or grown <= received + (1 << 20),  # a second allocation would double it
    ]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("device", DEVICES)
def test_receivers_allocate_each_buffer_once(dist_world: DistWorld, device: str) -> None:
    got = dist_world(receivers_allocate_once, world_size=2, timeout=120, args=(device,))
    assert got == [[True, True, True]] * 2


def header_rows_through_reused_pinned_buffers() -> list[object]:
    """NCCL's header all_gather (a world of one runs none, so called directly): pinned host rows, made once."""
    import torch.distributed as dist

    from distinit.broadcast import _header

    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    scratch = _header.GatherScratch(1)
    tables = []
    for seq, inline in ((1, b"x" * 100), (2, b"y" * 10)):
        words = _header.fixed_words(seq=seq, op=_header.OP_OBJECT, src=0, aux_nbytes=len(inline), inline=len(inline))
        assert scratch.take()
        exchanged = _header.gather_rows(
            words, group=dist.group.WORLD, device=device, inline=inline, wait_for=None, scratch=scratch
        )
        rows = scratch.on(device)
        tables.append((exchanged.views[0].seq, exchanged.inline_bytes(0), rows.recv_host.data_ptr()))
    stale = bytes(scratch.on(device).recv[_header.FIXED_BYTES + 10 : _header.FIXED_BYTES + 100])
    return [
        stale == bytes(90),  # the shorter payload zeroed what the longer one left
        [seq for seq, _, _ in tables] == [1, 2],
        [data for _, data, _ in tables] == [b"x" * 100, b"y" * 10],
        tables[0][2] == tables[1][2] and scratch.on(device).recv_host.is_pinned(),
        len(scratch.by_device) == 1,
    ]


@pytest.mark.timeout(120)
@CUDA
def test_nccl_header_rows_reuse_one_pinned_buffer(dist_world: DistWorld) -> None:
    got = dist_world(header_rows_through_reused_pinned_buffers, world_size=1, backend="nccl", timeout=90)
    assert got == [[True, True, True, True, True]]
