"""The resolver over real launcher captures (tests/integration/launchers/captures, written by capture.py).

Each capture is the environment of every task of one real launch (Slurm 22.05, Open MPI 4.1, MPICH 4.0
hydra, torchrun 2.13). Resolving them all must give one consistent world: every rank exactly once, the
same size, master and port on every rank, and no two ranks on the same (node, local rank) slot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distinit import NotLaunchedError, env_from_scheduler

CAPTURES = Path(__file__).resolve().parents[2] / "integration" / "launchers" / "captures"
SHAPES = sorted(path.stem for path in CAPTURES.glob("*.json"))
NOT_LAUNCHED = {"slurm-batch-step", "slurm-salloc-shell"}


def _tasks(shape: str) -> list[dict[str, str]]:
    tasks = json.loads((CAPTURES / f"{shape}.json").read_text())
    assert isinstance(tasks, list)
    assert tasks
    return tasks


def test_captures_exist() -> None:
    assert len(SHAPES) >= 15, f"expected the real-launcher captures in {CAPTURES}"


@pytest.mark.parametrize("shape", sorted(set(SHAPES) - NOT_LAUNCHED))
def test_capture_resolves_to_one_consistent_world(shape: str) -> None:
    worlds = [env_from_scheduler(task) for task in _tasks(shape)]
    size = worlds[0].world_size
    assert sorted(w.rank for w in worlds) == list(range(size)), "every rank exactly once"
    assert {w.world_size for w in worlds} == {size}
    assert len({(w.master_addr, w.master_port) for w in worlds}) == 1, "one master for everyone"
    assert len({w.launcher for w in worlds}) == 1
    assert worlds[0].launcher == shape.split("-")[0]
    slots = [(w.node_rank, w.local_rank) for w in worlds if w.node_rank is not None]
    assert len(slots) == len(set(slots)), "two ranks claim the same node and local rank"
    for w in worlds:
        assert w.local_world_size is None or w.local_rank < w.local_world_size


@pytest.mark.parametrize("shape", sorted(set(SHAPES) & NOT_LAUNCHED))
def test_batch_script_and_salloc_shell_are_not_launched(shape: str) -> None:
    for task in _tasks(shape):
        with pytest.raises(NotLaunchedError, match="srun"):
            env_from_scheduler(task)
        assert env_from_scheduler(task, strict=False).world_size == 1


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.startswith("slurm-") and s not in NOT_LAUNCHED])
def test_slurm_node_rank_matches_slurmd_nodename(shape: str) -> None:
    # The emulated nodes are named by slurmd -N; the node rank must index SLURM_STEP_NODELIST at SLURMD_NODENAME.
    from distinit import expand_hostlist

    for task in _tasks(shape):
        env = env_from_scheduler(task)
        hosts = expand_hostlist(task["SLURM_STEP_NODELIST"])
        assert env.node_rank is not None
        assert hosts[env.node_rank] == task["SLURMD_NODENAME"]
        if task.get("SLURM_DISTRIBUTION", "").startswith("arbitrary") and len(set(hosts)) > 1:
            assert env.master_addr is None  # rank 0 follows SLURM_HOSTFILE: unknown from the environment
        else:
            assert env.master_addr == hosts[0]
