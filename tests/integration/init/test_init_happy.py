from __future__ import annotations

import pytest
from init_launch import Launcher

FAST = {"deadline": 20, "attempt_timeout": 5}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_happy_path(launcher: Launcher, port: int, world_size: int) -> None:
    ranks = [launcher.start(r, world_size, port, kwargs=FAST) for r in range(world_size)]
    results = [r.result(45) for r in ranks]
    for rank, res in enumerate(results):
        assert res["ok"], res
        report = res["report"]
        assert report["rank"] == rank
        assert report["store"] == ("hosted" if rank == 0 else "client")
        assert report["attempts"][-1]["phase"] == "done"
        assert res["elapsed"] < 10
