"""Fixtures for the real-launcher tests: an emulated Slurm cluster and a launch helper.

The cluster (munged if none answers, slurmctld, three ``slurmd -N dnodeN``; see
``scripts/launchers/cluster.py``) starts once per session (under pytest-xdist: once per worker, with ports
of its own; ``launch_support.start_cluster``), on demand, and is stopped by pid at the end. Missing
launchers or missing root skip with a reason; with ``CI=true`` they fail, so CI cannot go green without
really running them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from launch_support import Launcher, cluster, require, shapes, start_cluster, stop_cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    """A 3-node Slurm 22.05 cluster on this machine, for the whole session."""
    require(["slurm"])
    workdir = tmp_path_factory.mktemp("slurm-cluster")
    try:
        started = start_cluster(workdir)
    except (OSError, RuntimeError) as exc:
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(workdir.rglob("*.log"))
        )
        pytest.fail(f"could not start the emulated Slurm cluster: {exc}\n{logs}", pytrace=False)
    try:
        yield started
    finally:
        stop_cluster(workdir)


@pytest.fixture
def launch(request: pytest.FixtureRequest, tmp_path: Path) -> Launcher:
    """``launch(shape, command, *, with_master, timeout, allow_failure)`` runs COMMAND in every task."""
    counter = iter(range(1000))

    def run(
        shape: shapes.Shape,
        command: Sequence[str],
        *,
        with_master: bool = True,
        timeout: float = 90.0,
        allow_failure: bool = False,
    ) -> shapes.Result:
        require(shape.needs)
        slurm = request.getfixturevalue("slurm_cluster") if "slurm" in shape.needs else None
        outdir = tmp_path / f"{shape.name}-{next(counter)}"
        ctx = shapes.Context(python=sys.executable, outdir=outdir, cluster=slurm, with_master=with_master)
        return shapes.run_shape(shape, ctx, command, timeout=timeout, allow_failure=allow_failure)

    return run
