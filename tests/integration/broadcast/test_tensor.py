"""broadcast_tensor on real gloo process groups (world 2 and 3): round trips and the mismatch matrix."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from distinit.testing import DistWorld

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128, torch.uint16, torch.uint32,
    torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip
SHAPES = [(), (0,), (3, 5), (7, 1, 2), (300, 700)]  # scalar, empty, small (inline), 3-d, large (> 4 KiB)


def _reference(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    numel = int(torch.Size(shape).numel())
    raw = torch.randint(
        0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7)
    )
    if dtype == torch.bool:
        raw = raw & 1  # bool bytes other than 0/1 are not valid bools (torch normalises them on copy)
    return raw.view(dtype).reshape(shape)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def round_trip_every_dtype(dtypes: list[torch.dtype] = DTYPES) -> list[str]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor

    rank, failures = dist.get_rank(), []
    for dtype in dtypes:
        for shape in SHAPES:
            ref = _reference(dtype, shape)
            for receiver_buffer in (False, True):
                arg = ref.clone() if rank == 0 else torch.empty(shape, dtype=dtype) if receiver_buffer else None
                got = broadcast_tensor(arg)
                if got.dtype != dtype or tuple(got.shape) != shape or not _same_bytes(got, ref):
                    failures.append(f"{dtype}{list(shape)} buffer={receiver_buffer}")
                if receiver_buffer and rank != 0 and got is not arg:
                    failures.append(f"{dtype}{list(shape)}: the buffer was not filled in place")
    noncontig = torch.zeros(6, 4).t() if rank else torch.arange(24.0).reshape(6, 4).t()
    got = broadcast_tensor(noncontig)
    if not torch.equal(got, torch.arange(24.0).reshape(6, 4).t()):
        failures.append("non-contiguous buffer")
    # Conjugate and negative views read other values than their memory holds: values must arrive, not raw bytes.
    for numel in (3, 3000):  # inline in the header, and through the payload broadcast
        values = torch.arange(numel, dtype=torch.float32).to(torch.complex64) * (1 + 2j)
        for make in (lambda t: t.conj(), lambda t: t.conj().imag):
            expected = make(values).resolve_conj().resolve_neg()
            sent = make(values.clone()) if rank == 0 else None
            got = broadcast_tensor(sent)
            buffer = make(torch.zeros_like(values)) if rank else make(values.clone())
            filled = broadcast_tensor(buffer)
            if not (torch.equal(got.resolve_conj().resolve_neg(), expected) and torch.equal(filled, expected)):
                failures.append(f"conjugate/negative view of {numel} elements")
    return failures


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_dtype_round_trips_bit_exactly(dist_world: DistWorld, world_size: int) -> None:
    assert dist_world(round_trip_every_dtype, world_size=world_size, timeout=90) == [[]] * world_size


def _case_args(case: str, rank: int, last: int, src: int = 0) -> tuple[Any, dict[str, Any]]:
    receiver = rank != src
    table: dict[str, Any] = {
        "shape": torch.zeros(2, 3) if not receiver else torch.zeros(3, 2),
        "same-numel-shape-one-rank": torch.zeros(768, 1024) if rank == last else torch.zeros(1024, 768),
        "dtype": torch.zeros(6) if not receiver else torch.zeros(6, dtype=torch.int32),
        "dtype-itemsize": torch.zeros(4) if not receiver else torch.zeros(4, dtype=torch.float64),
        "smaller-receiver": torch.zeros(6) if not receiver else torch.zeros(4),
        "larger-receiver": torch.zeros(4) if not receiver else torch.zeros(6),
        "large-smaller-receiver": torch.zeros(10_000) if not receiver else torch.zeros(9_999),
        "device-type": torch.zeros(3) if not receiver else torch.empty(3, device="meta"),
        "src-passes-none": None,
        "receiver-passes-a-list": torch.zeros(3) if not receiver else [1, 2, 3],
    }
    if case == "src-disagreement":
        return torch.zeros(3), {"src": rank}
    if case == "src-outside-group":
        return torch.zeros(3), {"src": 7}
    return table[case], {}


EXPECTED_FIELD = {
    "shape": "shape", "same-numel-shape-one-rank": "shape", "dtype": "dtype", "dtype-itemsize": "dtype",
    "smaller-receiver": "shape", "larger-receiver": "shape", "large-smaller-receiver": "shape",
    "device-type": "device", "src-passes-none": "argument", "receiver-passes-a-list": "argument",
    "src-disagreement": "src", "src-outside-group": "src",
}  # fmt: skip


def mismatch_matrix() -> list[tuple[str, str, str, tuple[int, ...], float]]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor
    from distinit.errors import BroadcastMismatchError

    rank, seen = dist.get_rank(), []
    for case in EXPECTED_FIELD:
        arg, kw = _case_args(case, rank, dist.get_world_size() - 1)
        start = time.monotonic()
        try:
            broadcast_tensor(arg, **kw)
            seen.append((case, "no error", "", (), time.monotonic() - start))
        except BroadcastMismatchError as exc:
            seen.append((case, exc.field, str(exc), exc.ranks, time.monotonic() - start))
    # After every mismatch the group is still in step: a correct call goes through.
    ok = broadcast_tensor(torch.arange(5.0) if rank == 0 else None)
    seen.append(("after", "ok" if torch.equal(ok, torch.arange(5.0)) else "corrupt", "", (), 0.0))
    return seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_mismatch_matrix_raises_the_same_error_on_every_rank(dist_world: DistWorld, world_size: int) -> None:
    _assert_same_verdicts_everywhere(dist_world(mismatch_matrix, world_size=world_size, timeout=45))


def _assert_same_verdicts_everywhere(per_rank: list[list[tuple[str, str, str, tuple[int, ...], float]]]) -> None:
    for index, case in enumerate(EXPECTED_FIELD):
        rows = [seen[index] for seen in per_rank]
        assert {row[0] for row in rows} == {case}
        assert {row[1] for row in rows} == {EXPECTED_FIELD[case]}, (case, rows[0][2])
        assert len({row[2] for row in rows}) == 1, f"{case}: ranks raised different messages"
        assert max(row[4] for row in rows) < 2.0, f"{case}: took {max(row[4] for row in rows):.2f} s"
        assert "Raised on all" in rows[0][2]
    assert all(seen[-1][:2] == ("after", "ok") for seen in per_rank)


def matrix_and_round_trips_by_all_gather() -> tuple[list[tuple[str, str, str, tuple[int, ...], float]], list[str]]:
    from distinit.broadcast import _header

    _header.ALL_GATHER_ON_CPU = True  # the exchange NCCL uses, run here on gloo
    try:
        return mismatch_matrix(), round_trip_every_dtype([torch.bfloat16, torch.uint64])
    finally:
        _header.ALL_GATHER_ON_CPU = False  # in case the rank process is reused


@pytest.mark.timeout(60)
def test_the_all_gather_exchange_gives_the_same_verdicts_and_bytes(dist_world: DistWorld) -> None:
    """The header exchange NCCL uses (one all_gather of the row) forced on gloo: same matrix, same bytes."""
    per_rank = dist_world(matrix_and_round_trips_by_all_gather, world_size=3, timeout=45)
    _assert_same_verdicts_everywhere([matrix for matrix, _ in per_rank])
    assert [failures for _, failures in per_rank] == [[], [], []]


def test_same_numel_message_reads_like_the_style_guide(dist_world: DistWorld) -> None:
    per_rank = dist_world(mismatch_matrix, world_size=3, timeout=45)
    _, field, text, ranks, _ = per_rank[0][1]  # "same-numel-shape-one-rank": only rank 2 is wrong
    assert field == "shape"
    assert ranks == (2,)
    assert "rank 0 sends float32[1024, 768]" in text
    assert "rank 2 passed a buffer of float32[768, 1024]" in text
    assert "fix: pass None on receivers" in text
    assert "torch.empty(1024, 768) on rank 2" in text


def timeout_when_a_rank_skips() -> tuple[str, str, float]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor
    from distinit.errors import BroadcastError

    if dist.get_rank() == 1:
        return ("skipped", "", 0.0)  # the bug under test: this rank never makes the call
    start = time.monotonic()
    try:
        broadcast_tensor(torch.zeros(3), timeout=1.0)
    except BroadcastError as exc:
        return (type(exc).__name__, exc.field, time.monotonic() - start)
    return ("no error", "", time.monotonic() - start)


@pytest.mark.timeout(60)
def test_timeout_bounds_a_call_a_peer_never_makes(dist_world: DistWorld) -> None:
    kind, field, elapsed = dist_world(timeout_when_a_rank_skips, world_size=2, timeout=30)[0]
    assert kind == "BroadcastTimeoutError"  # not a mismatch: nothing was compared
    assert field in {"timeout", "peer"}
    assert elapsed < 10


def successive_small_calls_stay_independent() -> list[str]:
    """Each group reuses its header buffers: what a call returned must not change with the next call."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object, broadcast_tensor

    rank, problems = dist.get_rank(), []
    first = broadcast_tensor(torch.arange(256.0) if rank == 0 else None)  # 1 KiB: inline in the header
    second = broadcast_tensor(torch.full((3,), 7, dtype=torch.int8) if rank == 0 else None)  # shorter payload
    words = broadcast_object(["a" * 900] if rank == 0 else None, type=list[str])
    third = broadcast_tensor(torch.ones(3, dtype=torch.int8) if rank == 0 else None)
    if not torch.equal(first, torch.arange(256.0)):
        problems.append("the first result changed")
    if not torch.equal(second, torch.full((3,), 7, dtype=torch.int8)) or words != ["a" * 900]:
        problems.append("a later result is wrong")
    if not torch.equal(third, torch.ones(3, dtype=torch.int8)):
        problems.append("stale inline bytes leaked into a shorter payload")
    return problems


@pytest.mark.timeout(60)
def test_successive_small_calls_stay_independent(dist_world: DistWorld) -> None:
    assert dist_world(successive_small_calls_stay_independent, world_size=2, timeout=30) == [[], []]


def subgroup_with_group_local_src() -> list[float]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor
    from distinit.errors import BroadcastMismatchError

    rank = dist.get_rank()
    group = dist.new_group([1, 2])
    if rank == 0:
        return []
    # src=1 is group rank 1, i.e. global rank 2.
    got = broadcast_tensor(torch.tensor([float(rank)]) if rank == 2 else None, src=1, group=group)
    with pytest.raises(BroadcastMismatchError, match="not the global rank") as caught:
        broadcast_tensor(torch.zeros(2), src=2, group=group)  # the global rank passed by mistake
    return [*got.tolist(), caught.value.field]


@pytest.mark.timeout(60)
def test_subgroup_src_is_group_local(dist_world: DistWorld) -> None:
    assert dist_world(subgroup_with_group_local_src, world_size=3, timeout=30) == [[], [2.0, "src"], [2.0, "src"]]


def cuda_round_trip() -> bool:
    from distinit.broadcast import broadcast_tensor

    t = torch.arange(10.0, device="cuda")
    return bool(torch.equal(broadcast_tensor(t, device="cuda").cpu(), torch.arange(10.0)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (gloo stages CUDA tensors via CPU)")
@pytest.mark.timeout(60)
def test_cuda_tensors_over_gloo_are_staged(dist_world: DistWorld) -> None:
    assert dist_world(cuda_round_trip, world_size=1, timeout=30) == [True]


def nccl_world_of_one() -> bool:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object, broadcast_tensor

    torch.cuda.set_device(0)
    got = broadcast_tensor(torch.arange(4.0, device="cuda"))
    again = broadcast_tensor(None, device="cuda") if dist.get_world_size() > 1 else got
    return bool(torch.equal(again.cpu(), torch.arange(4.0))) and broadcast_object(3, type=int) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for the NCCL backend")
@pytest.mark.timeout(60)
def test_nccl_uses_the_current_cuda_device(dist_world: DistWorld) -> None:
    assert dist_world(nccl_world_of_one, world_size=1, backend="nccl", timeout=30) == [True]
