"""Real Lightning ``Trainer.fit`` under the REAL launchers on emulated nodes (issue 13): the motivating bug.

Under Open MPI and MPICH nobody sets ``NODE_RANK``, so Lightning's ``NODE_RANK * devices + LOCAL_RANK``
gives every node ranks 0..n-1. With ``distinit.setup()`` the world itself says which node each rank is on
(host identities exchanged once the group forms): Lightning's global rank must equal torch's on every
rank, and its node rank must be the node the launcher really used (the ground truth ``task.py`` records,
which distinit does not read). A hand-exported wrong ``NODE_RANK`` must fail at once, the same on every rank.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import shapes
from launch_support import Launcher

pytest.importorskip("lightning")
pytestmark = pytest.mark.launcher

WORKER = Path(__file__).with_name("lightning_world.py")
#: Two emulated nodes, two tasks each, one block of consecutive ranks per node: Lightning's DDP layout.
BLOCK = ["openmpi-2node", "slurm-block", "mpich-2node"]
#: Two emulated nodes, ranks dealt round robin: Lightning's arithmetic cannot number them.
ROUND_ROBIN = ["openmpi-2node-bynode", "slurm-cyclic"]


def _line(record: dict[str, Any]) -> dict[str, Any]:
    lines = [line for line in record.get("stdout", "").splitlines() if line.startswith("{")]
    detail = (
        f"task exited {record.get('rc')}\nstdout: {record.get('stdout')}\nstderr: {record.get('stderr', '')[-3000:]}"
    )
    assert len(lines) == 1, detail
    found: dict[str, Any] = json.loads(lines[0])
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", BLOCK)
def test_lightning_trains_as_the_launcher_placed_the_ranks(name: str, launch: Launcher) -> None:
    shape = shapes.SHAPES_BY_NAME[name]
    result = launch(shape, [sys.executable, str(WORKER), "setup"], timeout=180)
    lines = [_line(record) for record in result.records]
    assert all(line["ok"] for line in lines), lines
    assert sorted(line["torch_rank"] for line in lines) == list(range(shape.world_size))
    on_node: dict[int, list[int]] = defaultdict(list)
    for record, line in zip(result.records, lines, strict=True):
        true_node = shape.node_of(record)
        assert line["lightning_global_rank"] == line["torch_rank"], line  # no two rank zeros
        assert line["lightning_world_size"] == line["torch_world_size"] == shape.world_size
        assert line["lightning_node_rank"] == line["node_rank"]
        assert line["exported_node_rank"] == str(line["node_rank"])
        assert line["steps"] == 3
        on_node[true_node].append(line["node_rank"])
    # Every rank of a real node got one node rank, and distinct nodes got distinct ones.
    assert all(len(set(ranks)) == 1 for ranks in on_node.values()), on_node
    assert len({ranks[0] for ranks in on_node.values()}) == len(shape.nodes), on_node


@pytest.mark.timeout(240)
def test_a_wrong_node_rank_fails_the_same_on_every_rank(launch: Launcher) -> None:
    # Open MPI's fake nodes (by slot): NODE_RANK=0 exported on both, as a job script's `export NODE_RANK=0`.
    shape = shapes.SHAPES_BY_NAME["openmpi-2node"]
    result = launch(shape, [sys.executable, str(WORKER), "wrong-node-rank"], timeout=180, allow_failure=True)
    lines = [_line(record) for record in result.records]
    assert [line.get("error") for line in lines] == ["ConflictingEnvError"] * shape.world_size, lines
    assert len({line["message"] for line in lines}) == 1, lines  # one verdict, word for word
    assert "2 hosts claim node rank 0" in lines[0]["message"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ROUND_ROBIN)
def test_round_robin_placement_is_refused_on_every_rank(name: str, launch: Launcher) -> None:
    # Without distinit: Lightning's global ranks 0,0,1,3 against torch's 0,1,2,3 (two rank zeros, wrong
    # sharding), silently. With setup() + DistinitEnvironment: the ranks compare Lightning's numbering in
    # one all_reduce and all of them stop with the same error, before fit; none waits for the others.
    shape = shapes.SHAPES_BY_NAME[name]
    result = launch(shape, [sys.executable, str(WORKER), "setup"], timeout=180, allow_failure=True)
    lines = [_line(record) for record in result.records]
    assert len(lines) == shape.world_size, (lines, result.launcher_output)
    assert [line.get("error") for line in lines] == ["ConflictingEnvError"] * len(lines), lines
    assert len({line["message"] for line in lines}) == 1, lines
    assert "differ from the launcher's on ranks [1, 2]" in lines[0]["message"]
    assert result.seconds < 120
