"""AutoTimeout agrees one value across real gloo ranks."""

from __future__ import annotations

import pytest

from distinit.testing import run_distributed


def agree_after_local_steps() -> float:
    import torch.distributed as dist

    from distinit.watchdog import AutoTimeout

    auto = AutoTimeout(factor=5, warmup=1)
    auto.observe(100.0)  # warmup: ignored
    auto.observe(0.5 * (dist.get_rank() + 1))  # rank 0: 0.5 s, rank 1: 1.0 s
    return auto.agree()


@pytest.mark.timeout(90)
def test_agree_takes_the_maximum_across_ranks() -> None:
    assert run_distributed(agree_after_local_steps, world_size=2, timeout=60) == [5.0, 5.0]
