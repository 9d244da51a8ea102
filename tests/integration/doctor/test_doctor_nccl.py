"""The opt-in ``nccl`` check on real ranks: a real NCCL all_reduce where GPUs exist, ``skip`` where none do."""

from __future__ import annotations

import pytest
import torch
from doctor_launch import Ranks, check, rank_environ


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU path is tested below)")
def test_nccl_all_reduce_passes_on_gpus(ranks: Ranks, port: int) -> None:
    size = min(2, torch.cuda.device_count())  # one rank per device: NCCL refuses two ranks on one GPU
    for rank in range(size):
        ranks.start(rank_environ(rank, size, port), args=("--json", "--nccl", "--timeout", "60"))
    results = ranks.results(100)
    status, world = results[0]
    found = check(world, "nccl")
    assert found["status"] == "pass", found
    assert found["evidence"]["sum"] == size and found["evidence"]["device"] == 0
    assert status == 0 and all(code == 0 for code, _ in results)


@pytest.mark.timeout(90)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: this machine has CUDA")
def test_nccl_is_skip_with_the_reason_on_cpu_ranks(ranks: Ranks, port: int) -> None:
    for rank in range(2):
        ranks.start(rank_environ(rank, 2, port), args=("--json", "--nccl", "--timeout", "60"))
    (status0, world), (status1, _) = ranks.results(60)
    found = check(world, "nccl")
    assert found["status"] == "skip" and "no rank sees a CUDA device" in found["summary"], found
    assert world["ok"] and status0 == status1 == 0
