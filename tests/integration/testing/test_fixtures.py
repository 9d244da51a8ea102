"""scheduler_env, free_store and dist_store fixtures, and scheduler_env handed to real ranks."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from distinit.env import env_from_scheduler
from distinit.testing import DistWorld, scheduler_env

pytestmark = pytest.mark.timeout(60)


def test_scheduler_env_fixture_replaces_inherited_launcher_variables(
    scheduler_env: Callable[..., dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "7")  # as if the suite itself ran under mpirun
    monkeypatch.setenv("RANK", "5")
    env = scheduler_env("slurm", nodes=2, tasks_per_node=8, rank=11)
    assert "OMPI_COMM_WORLD_RANK" not in os.environ
    assert "RANK" not in os.environ
    assert os.environ["SLURM_PROCID"] == env["SLURM_PROCID"] == "11"
    world = env_from_scheduler()
    assert (world.rank, world.world_size, world.launcher) == (11, 16, "slurm")


def test_scheduler_env_fixture_writes_node_files(scheduler_env: Callable[..., dict[str, str]]) -> None:
    env = scheduler_env("pals", nodes=2, tasks_per_node=2, hostnames=["x1", "x2"], rank=3)
    with open(env["PBS_NODEFILE"]) as handle:
        assert handle.read().split() == ["x1", "x2"]


def test_free_store_is_bound_and_reachable(free_store: Any) -> None:
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    assert free_store.port > 0
    client = TCPStore("127.0.0.1", free_store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("key", "value")
    assert free_store.get("key") == b"value"


def test_dist_store_inits_a_single_process_group(dist_store: Any) -> None:
    dist.init_process_group("gloo", store=dist_store, rank=0, world_size=1)
    try:
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        assert int(tensor) == 1
    finally:
        dist.destroy_process_group()


def resolve_own_env() -> tuple[int, int, str]:
    world = env_from_scheduler()
    return world.rank, world.world_size, world.launcher


def test_per_rank_scheduler_env_on_real_ranks(dist_world: DistWorld) -> None:
    results = dist_world(
        resolve_own_env,
        world_size=2,
        env=lambda rank: scheduler_env("openmpi", nodes=1, tasks_per_node=2, rank=rank),
    )
    assert results == [(0, 2, "openmpi"), (1, 2, "openmpi")]
