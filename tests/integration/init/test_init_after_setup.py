"""A rank that dies right after setup(): the survivors' output names it (rank, host, pid, last seen).

Real processes, a real gloo group: rank 2 of 3 is SIGKILLed once every rank returned from setup(); the others
then call all_reduce (gloo: "Connection closed by peer") and end with the traceback, next to which distinit
logs the rank that went away.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from init_launch import free_port
from tests._zygote import popen

WORKER = Path(__file__).with_name("_after_setup_worker.py")


def _start(rank: int, world: int, port: int, where: Path, **spec: object) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    log = (where / f"rank{rank}.log").open("wb")
    with log:
        return popen(
            [sys.executable, str(WORKER), json.dumps({"dir": str(where), **spec})],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.timeout(240)
def test_a_rank_killed_after_setup_is_named_by_the_survivors(tmp_path: Path) -> None:
    port, world = free_port(), 3
    procs = [_start(r, world, port, tmp_path) for r in range(world)]
    try:
        end = time.monotonic() + 150  # three interpreters import torch on a loaded 2-core machine
        while not all((tmp_path / f"ready{r}").exists() for r in range(world)):
            assert time.monotonic() < end, [p.poll() for p in procs]
            assert all(p.poll() is None for p in procs), [(tmp_path / f"rank{r}.log").read_text() for r in range(world)]
            time.sleep(0.05)
        victim = procs[2]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        (tmp_path / "go").touch()
        for proc in procs[:2]:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    named = f"rank 2 (host {socket.gethostname()}, pid {victim.pid})"
    for rank in (0, 1):
        log = (tmp_path / f"rank{rank}.log").read_text()
        assert procs[rank].returncode != 0, log
        assert "the collective failed because a peer went away" in log, log
        assert named in log and "its process is gone" in log and "last heartbeat" in log, log


@pytest.mark.timeout(240)
def test_ranks_that_finish_first_are_no_lost_ranks(tmp_path: Path) -> None:
    # A normal end where rank 0 outlives the others by more than the loss bound (5 s at this size): the
    # others' teardown() says goodbye on the store, so rank 0 warns about nobody.
    port, world = free_port(), 2
    procs = [_start(r, world, port, tmp_path, mode="finish", work=8.0) for r in range(world)]
    try:
        for proc in procs:
            proc.wait(timeout=200)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    logs = [(tmp_path / f"rank{rank}.log").read_text() for rank in range(world)]
    assert [proc.returncode for proc in procs] == [0, 0], logs
    assert (tmp_path / "ready1").exists() and (tmp_path / "ready0").exists(), logs
    assert "no heartbeat" not in logs[0] and "stopped" not in logs[0], logs[0]
