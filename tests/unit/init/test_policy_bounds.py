"""The duration policy of init (Bounds) and the one backend choice."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch

from distinit._duration import MAX_WAIT
from distinit.init._device import choose_backend
from distinit.init._policy import Bounds


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
