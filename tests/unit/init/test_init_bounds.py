"""The duration policy of init (Bounds) and the one backend choice."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch

from distinit._duration import MAX_WAIT
from distinit.errors import ConflictingEnvError
from distinit.init._backend import choose_backend
from distinit.init._bounds import Bounds


@pytest.mark.parametrize("huge", [math.inf, 1e300, 10**400, timedelta.max], ids=["inf", "1e300", "10**400", "td-max"])
def test_huge_and_infinite_bounds_never_overflow_a_native_wait(huge: object) -> None:
    bounds = Bounds.of(deadline=huge, attempt_timeout=huge, pg_timeout=huge)
    assert bounds.deadline >= 1e300 or bounds.deadline == timedelta.max.total_seconds()
    assert bounds.collective_timeout("gloo") <= timedelta(seconds=MAX_WAIT)
    assert bounds.init_timeout() == timedelta(seconds=MAX_WAIT)


def test_default_collective_timeout_is_torchs() -> None:
    bounds = Bounds.of(deadline=600, attempt_timeout=30, pg_timeout=None)
    assert bounds.init_timeout() is None
    assert bounds.collective_timeout("gloo") == timedelta(minutes=30)
    assert Bounds.of(deadline=1, attempt_timeout=1, pg_timeout=timedelta(seconds=5)).collective_timeout(
        "nccl"
    ) == timedelta(seconds=5)


def test_backend_choice() -> None:
    assert choose_backend("mpi", local_rank=0) == "mpi"
    assert choose_backend(None, local_rank=0, device_id=0) == "nccl"
    if not torch.cuda.is_available():  # a CPU machine: gloo for any local rank
        assert choose_backend(None, local_rank=10**6) == "gloo"


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "want"),
    [(0, 1, "nccl"), (1, 2, "nccl"), (0, None, "nccl"), (0, 4, "error"), (3, 4, "error"), (2, None, "error")],
)
def test_backend_choice_refuses_more_ranks_than_gpus(
    monkeypatch: pytest.MonkeyPatch, local_rank: int, local_world_size: int | None, want: str
) -> None:
    """Two visible GPUs: a host of more ranks would mix NCCL and gloo, so every one of its ranks raises."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    if want != "error":
        assert choose_backend(None, local_rank=local_rank, local_world_size=local_world_size) == want
        return
    with pytest.raises(ConflictingEnvError) as caught:
        choose_backend(None, local_rank=local_rank, local_world_size=local_world_size)
    text = str(caught.value)
    assert "2 CUDA device(s) visible (CUDA_VISIBLE_DEVICES='0,1')" in text
    assert "--nproc-per-node=2" in text and "setup('gloo')" in text
    assert caught.value.variables == ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
    assert choose_backend("gloo", local_rank=local_rank, local_world_size=local_world_size) == "gloo"
