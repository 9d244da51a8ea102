"""The shm and file broadcast transports under the REAL launchers (issue 17): ``srun`` on two emulated
Slurm nodes and ``mpirun.openmpi`` on two fake nodes. The emulated nodes share this machine's kernel and
``/dev/shm``, so shm is one host here (as it physically is); the route is the same code as on one real node.
Every rank must receive src's bytes exactly through ``via="shm"``, ``zero_copy`` and ``via="file"``, with no
fallback, and no segment or file may be left behind."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import shapes
from launch_support import Launcher

pytestmark = pytest.mark.launcher

TASK = Path(__file__).with_name("via_task.py")


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("distinit-bc-")}


def _line(record: dict[str, Any]) -> dict[str, Any]:
    lines = [line for line in record.get("stdout", "").splitlines() if line.startswith("{")]
    detail = f"rc {record.get('rc')}\nstdout: {record.get('stdout')}\nstderr: {record.get('stderr', '')[-3000:]}"
    assert len(lines) == 1, detail
    found: dict[str, Any] = json.loads(lines[0])
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["slurm-block", "openmpi-2node"])
def test_shm_and_file_transports_under_the_launcher(name: str, launch: Launcher, tmp_path: Path) -> None:
    shape = shapes.SHAPES_BY_NAME[name]
    shared = tmp_path / "shared"
    shared.mkdir()
    before = _segments()
    result = launch(shape, [sys.executable, str(TASK), str(shared)], timeout=180)
    lines = [_line(record) for record in result.records]
    assert sorted(line["rank"] for line in lines) == list(range(shape.world_size))
    for line in lines:
        assert line["shm"] == line["zero_copy"] == line["file"] == line["want"], line
        assert line["fallbacks"] == [], line
    assert {line["node_rank"] for line in lines} == {0, 1}  # two launcher nodes, verified by setup()
    assert list(shared.iterdir()) == []  # the file is removed once every rank has read it
    assert _segments() - before == set()  # and nothing is ever named in /dev/shm (a sealed memfd)


CULPRIT_TASK = Path(__file__).with_name("culprit_task.py")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [0, 1], ids=["store-host", "beside-it"])
def test_under_srun_every_survivor_names_the_rank_killed_after_setup(victim: int, launch: Launcher) -> None:
    """srun -N2 -n4 (block) without -K1: one rank SIGKILLed after setup(); the others' all_reduce fails, and each
    names it. (The shapes' -K1 would have srun end the step at once and say which task failed itself.)"""
    block = shapes.SHAPES_BY_NAME["slurm-block"]
    opts = ("-K0", "-N2", "-n4", "--ntasks-per-node=2", "-w", "dnode[1-2]")
    shape = dataclasses.replace(block, name="slurm-block-k0", build=shapes.srun(*opts))
    result = launch(shape, [sys.executable, str(CULPRIT_TASK), str(victim)], timeout=240, allow_failure=True)
    lines = {}
    for record in result.records:
        for line in record.get("stdout", "").splitlines():
            if line.startswith("{"):
                parsed = json.loads(line)
                lines[parsed["rank"]] = (parsed["pid"], record)
    assert sorted(lines) == [0, 1, 2, 3], result.launcher_output[-3000:]
    pid, killed = lines[victim]
    assert killed["rc"] == -9, killed
    for rank, (_, record) in lines.items():
        if rank == victim:
            continue
        err = record.get("stderr", "")
        found = [line for line in err.splitlines() if "the collective failed because a peer went away" in line]
        assert found, (rank, err[-3000:])
        assert f"went away: rank {victim} (host " in found[0] and f"pid {pid})" in found[0], (rank, found[0])
        assert "unknown" not in found[0], found[0]
