"""The emulated Slurm cluster never outlives its owner: a session killed before its teardown leaves no daemon.

A clean-clone run stopped with SIGTERM left its worker's slurmctld and three slurmd running (the session
fixture's teardown never ran). ``cluster.start(owner=pid)`` starts a guard that waits on the owner's pidfd and
stops the cluster by pid when the owner ends.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from launch_support import cluster, require, start_cluster, stop_cluster


@pytest.mark.timeout(120)
def test_the_daemons_end_with_their_owner(tmp_path: Path) -> None:
    require(["slurm"])
    owner = subprocess.Popen(["sleep", "300"])  # stands for a test session that gets killed
    workdir = tmp_path / "cluster"
    try:
        started = start_cluster(workdir, nodes=1, owner=owner.pid)
        daemons = [p for p in started.procs if p.name in ("slurmctld", "slurmd")]
        guards = [p for p in started.procs if p.name == "guard"]
        assert len(daemons) == 2 and len(guards) == 1, started.procs
        assert all(cluster._alive(p) for p in [*daemons, *guards])
        owner.kill()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 60  # the guard sends SIGTERM, then SIGKILL after 5 s
        while any(cluster._alive(p) for p in [*daemons, *guards]):
            assert time.monotonic() < deadline, [(p.name, p.pid, cluster._alive(p)) for p in started.procs]
            time.sleep(0.1)
    finally:
        owner.kill()
        owner.wait(timeout=10)
        stop_cluster(workdir)


@pytest.mark.timeout(30)
def test_a_daemon_that_ends_during_the_start_is_reported_with_how_it_ended(tmp_path: Path) -> None:
    # A clean-clone run failed with only "guard (pid N) exited": whether it crashed or was killed (and by what
    # signal) was lost with the machine. The report now says how it ended and what it printed last.
    env = dict(os.environ)
    killed = cluster._spawn("guard", ["sh", "-c", "echo about to go; kill -TERM $$"], env, tmp_path / "guard.out")
    failed = cluster._spawn("slurmd", ["sh", "-c", "echo bad config >&2; exit 3"], env, tmp_path / "slurmd.out")
    assert cluster._ended(killed) == (
        f"guard (pid {killed.pid}) was killed by signal 15 (Terminated); its output ends: 'about to go'"
    )
    assert cluster._ended(failed) == f"slurmd (pid {failed.pid}) exited with status 3; its output ends: 'bad config'"
