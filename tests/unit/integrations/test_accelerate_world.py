"""What accelerate reads from each real launcher's environment, before and after distinit's export (issue 13).

On CPU, accelerate's ``PartialState`` takes its world from ``get_cpu_distributed_information()``, which
knows ``RANK``/``PMI_RANK``/``OMPI_COMM_WORLD_RANK``/``MV2_COMM_WORLD_RANK`` and the matching size and
local names, and nothing of Slurm's. Each real launcher capture is read by accelerate as the launcher set
it, then with ``env_from_scheduler(...).to_environ()`` on top (what ``setup()`` exports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from distinit import DistEnv, env_from_scheduler
from distinit.errors import NotLaunchedError

pytest.importorskip("accelerate")

from accelerate.utils import get_cpu_distributed_information

CAPTURES = Path(__file__).resolve().parents[2] / "integration" / "launchers" / "captures"


def launched(name: str) -> list[tuple[dict[str, str], DistEnv]]:
    """Each task of capture NAME with its resolved world (the batch script and salloc shell are not launched)."""
    tasks = []
    for task in json.loads((CAPTURES / f"{name}.json").read_text()):
        try:
            tasks.append((task, env_from_scheduler(task)))
        except NotLaunchedError:
            continue
    return tasks


#: Every capture with a launched task: its tasks and their resolved worlds.
WORLDS = {path.stem: tasks for path in sorted(CAPTURES.glob("*.json")) if (tasks := launched(path.stem))}


def accelerate_reads(environ: dict[str, str]) -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) as accelerate's CPU path reads ENVIRON."""
    with mock.patch.dict(os.environ, environ, clear=True):
        info: Any = get_cpu_distributed_information()
    return (info.rank, info.world_size, info.local_rank, info.local_world_size)


def launcher_world(env: DistEnv) -> tuple[int, int, int, int | None]:
    return (env.rank, env.world_size, env.local_rank, env.local_world_size)


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_after_distinits_export_accelerate_reads_the_launchers_world(name: str) -> None:
    for task, env in WORLDS[name]:
        read = accelerate_reads({**task, **env.to_environ()})
        want = launcher_world(env)
        assert read[:3] == want[:3], (name, task)
        if want[3] is not None:
            assert read[3] == want[3], (name, task)


@pytest.mark.parametrize("name", [n for n in sorted(WORLDS) if n.startswith("slurm-") and n != "slurm-pmi2"])
def test_alone_accelerate_reads_every_srun_task_as_process_0_of_1(name: str) -> None:
    tasks = WORLDS[name]
    assert all(env.world_size > 1 for _, env in tasks), name
    assert {accelerate_reads(task) for task, _ in tasks} == {(0, 1, 0, 1)}, name


def test_alone_accelerate_reads_every_srun_pmi2_task_as_local_rank_0() -> None:
    # srun --mpi=pmi2 -N2 -n4 exports PMI_RANK/PMI_SIZE but no local rank accelerate knows: every task is
    # its node's local main process, and a node-local world of 1 (so accelerate also demands MASTER_ADDR).
    tasks = WORLDS["slurm-pmi2"]
    assert [accelerate_reads(task) for task, _ in tasks] == [(r, 4, 0, 1) for r in range(4)]
    assert [env.local_rank for _, env in tasks] == [0, 1, 0, 1]


@pytest.mark.parametrize("name", [n for n in sorted(WORLDS) if n.startswith(("openmpi-", "mpich-", "torchrun-"))])
def test_alone_accelerate_reads_mpi_and_torchrun_worlds_right(name: str) -> None:
    for task, env in WORLDS[name]:
        assert accelerate_reads(task) == launcher_world(env), (name, task)
