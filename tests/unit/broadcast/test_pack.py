"""``_transport/pack.py``: the one allocator of receive buffers and the receive views built on it (no process group)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distinit.broadcast._group import GroupFacts
from distinit.broadcast._header import OP_TENSOR
from distinit.broadcast._transport.pack import allocate, receive_view
from distinit.errors import BroadcastMismatchError

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def ctx() -> Any:
    facts = GroupFacts(torch.nn.Module(), size=2, rank=1, global_rank=1, device=torch.device("cpu"))
    return facts.next_call(op=OP_TENSOR, src=0, timeout=None)


def test_allocate_makes_what_src_announced(ctx: Any) -> None:
    got = allocate(ctx, (3, 4), dtype=torch.bfloat16, device="cpu")
    assert (got.shape, got.dtype, got.device.type) == ((3, 4), torch.bfloat16, "cpu")


def test_pinned_is_plain_host_memory_without_cuda(ctx: Any) -> None:
    got = allocate(ctx, (16,), dtype=torch.uint8, device="cpu", pinned=True)
    assert got.is_pinned() == torch.cuda.is_available()


def test_an_allocation_that_fails_is_a_size_error_naming_the_rank_and_the_bytes(ctx: Any) -> None:
    with pytest.raises(BroadcastMismatchError) as caught:
        allocate(ctx, (1 << 62,), dtype=torch.uint8, device="cpu")  # 4 EiB: no machine has it
    exc = caught.value
    assert exc.field == "size" and exc.ranks == (1,)
    assert f"rank 1 cannot allocate the {1 << 62} bytes" in str(exc)


def test_a_contiguous_cpu_buffer_is_received_into_in_place(ctx: Any) -> None:
    out = torch.zeros(5, dtype=torch.float64)
    view, staged = receive_view(ctx, out)
    assert not staged and view.data_ptr() == out.data_ptr() and view.numel() == out.nbytes


def test_a_strided_buffer_is_received_through_one_staging_buffer(ctx: Any) -> None:
    out = torch.zeros(4, 6).t()
    view, staged = receive_view(ctx, out)
    assert staged and view.dtype == torch.uint8 and view.numel() == out.nbytes and view.data_ptr() != out.data_ptr()


@CUDA
def test_a_cuda_buffer_on_gloo_is_staged_through_pinned_host_memory(ctx: Any) -> None:
    out = torch.zeros(1024, device="cuda")
    view, staged = receive_view(ctx, out)
    assert staged and view.is_cpu and view.is_pinned() and view.numel() == out.nbytes
