"""The harness signals only processes it still holds, and stops everything a rank spawned (issue 12: 23, 24)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from tests._pidns import UNSHARE_PID, own_pid_namespace_unavailable

from distinit.errors import DistributedTestError
from distinit.testing import run_distributed

pytestmark = pytest.mark.timeout(120)

# Runs as pid 1 of a pid namespace of its own, so that forcing a pid through ns_last_pid races with
# nothing else on the machine. Rank 0 finishes early; while rank 1 holds the test open, a bystander
# that leads its own session (as a daemon would) is started with rank 0's recycled pid. The old
# teardown SIGKILLed that pid and its process group.
PID_REUSE = """
import json, os, subprocess, sys, threading, time

import torch.distributed as dist

from distinit.testing import run_distributed

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def early_or_late():
    where = os.environ["REUSE_DIR"]
    if dist.get_rank() == 0:
        with open(os.path.join(where, "early.pid"), "w") as handle:
            handle.write(str(os.getpid()))
        return os.getpid()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(where, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid()


def plant_bystander(found):
    where = os.environ["REUSE_DIR"]
    path = os.path.join(where, "early.pid")
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = int(open(path).read())
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)  # rank 0 exits and the fork server reaps it: its pid is free
    for _ in range(50):
        with open(NS_LAST_PID, "w") as handle:
            handle.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
        if proc.pid == pid:
            found["bystander"] = proc
            break
        proc.kill()
        proc.wait()
    open(os.path.join(where, "go"), "w").close()


if __name__ == "__main__":
    found = {}
    planter = threading.Thread(target=plant_bystander, args=(found,))
    planter.start()
    pids = run_distributed(early_or_late, world_size=2, timeout=90)
    planter.join()
    bystander = found.get("bystander")
    alive = bystander is not None and bystander.poll() is None
    print(json.dumps({"early": pids[0], "bystander": bystander and bystander.pid, "alive": alive}))
    if bystander is not None:
        bystander.kill()
"""


def test_a_recycled_pid_of_an_early_rank_is_never_signalled(tmp_path: Path) -> None:
    reason = own_pid_namespace_unavailable()
    if reason is not None:
        pytest.skip(reason)
    script = tmp_path / "pid_reuse.py"
    script.write_text(PID_REUSE)
    out = subprocess.run(
        [*UNSHARE_PID, sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "REUSE_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if report["bystander"] is None:
        pytest.skip(f"could not recycle pid {report['early']}: other processes took it first")
    assert report["bystander"] == report["early"]
    assert report["alive"], "the harness killed an unrelated process that had recycled an early rank's pid"


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _spawn_escapee(how: str, where: str) -> tuple[int, int]:
    """Start a sleeper that leaves this rank's session; its (pid, start time)."""
    pidfile = os.path.join(where, f"escapee{dist.get_rank()}")
    if how == "new-session":
        pid = subprocess.Popen(["sleep", "120"], start_new_session=True).pid
    else:  # setsid -f forks, the child calls setsid, the parent exits: a daemon's double fork
        script = f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 120"
        subprocess.run(["setsid", "-f", "sh", "-c", script], check=True, timeout=10)
        deadline = time.monotonic() + 10
        while not os.path.exists(pidfile) and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = int(Path(pidfile).read_text())
    started = _start_time(pid)
    assert started is not None
    return pid, started


def spawn_and_return(how: str, where: str) -> tuple[int, int]:
    return _spawn_escapee(how, where)


def spawn_and_hang_or_fail(how: str, where: str) -> None:
    if dist.get_rank() == 1:
        escapee = _spawn_escapee(how, where)
        Path(where, "escapees.json").write_text(json.dumps([escapee]))
        time.sleep(600)  # still running when rank 0's failure makes the harness stop it
    deadline = time.monotonic() + 30
    while not Path(where, "escapees.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("rank 0 fails once rank 1 has spawned")


def _assert_gone(escapees: list[Any], *, within: float = 2.0) -> None:
    """Every (pid, start time) is gone within ``within`` s; kills survivors so a failure leaks nothing."""
    held = [(int(pid), int(started)) for pid, started in escapees]
    deadline = time.monotonic() + within
    while (alive := [pid for pid, started in held if _start_time(pid) == started]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)  # checked a moment ago: still the process a rank spawned
    assert alive == [], "a process a rank spawned outlived the test"


def _needs(how: str) -> None:
    if how != "new-session" and shutil.which("setsid") is None:
        pytest.skip("needs setsid(1)")


@pytest.mark.parametrize("how", ["new-session", "setsid-double-fork"])
def test_descendants_that_leave_the_session_are_stopped_when_the_rank_exits(how: str, tmp_path: Path) -> None:
    _needs(how)
    _assert_gone(run_distributed(spawn_and_return, world_size=2, args=(how, str(tmp_path))))


@pytest.mark.parametrize("how", ["new-session", "setsid-double-fork"])
def test_descendants_of_a_rank_the_harness_stops_are_stopped_too(how: str, tmp_path: Path) -> None:
    _needs(how)
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(spawn_and_hang_or_fail, world_size=2, args=(how, str(tmp_path)), timeout=60)
    assert "rank 1 was stopped by the harness" in str(caught.value)
    _assert_gone(json.loads((tmp_path / "escapees.json").read_text()))
