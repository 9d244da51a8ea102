"""Who distinit's ``FileTimerServer`` may signal, how many timers a pid may hold, and its FIFO replaced (issue 33).

Found by an adversarial pass with same-user attacker processes: a FIFO line naming any same-user process
(a ``sleep``, the login shell above the daemon) had it SIGKILLed; 65,536 far-future timers for one pid left an
honest worker's timer dropped; a regular file put in the FIFO's place swallowed torch's clients' requests.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wd_helpers import Pinned, Workers, expired_for, read_events, read_json_line, wait_for

from distinit.watchdog._timer_server import MAX_TIMERS_PER_PID
from distinit.watchdog.elastic import FileTimerClient, FileTimerRequest, FileTimerServer

FT_WORKER = str(Path(__file__).with_name("ft_worker.py"))

pytestmark = pytest.mark.timeout(120)


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without torchelastic's variables (so no process is a worker by inheritance), plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}, **extra}


def _forge(fd: int, pid: int, scope: str = "forged", when: float | None = None) -> None:
    doc = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": time.time() - 1 if when is None else when}
    os.write(fd, json.dumps({**doc, "signal": int(signal.SIGKILL)}).encode() + b"\n")


def _event(events: Path, name: str, pid: int, outcome: str) -> Any:
    def find() -> dict[str, Any] | None:
        return next(
            (e for e in read_events(events) if (e["event"], e["pid"], e["outcome"]) == (name, pid, outcome)), None
        )

    return find


def test_only_workers_are_signalled_never_a_bystander_nor_an_ancestor_shell(
    workers: Workers, tmp_path: Path, events_file: Path
) -> None:
    pytest.importorskip("torch.distributed.elastic.timer")
    fifo = str(tmp_path / "timer.fifo")
    # A launcher (its children are workers by --workers-of), a bystander (a same-user `sleep` nobody launched
    # as a worker), and the daemon two shells down: outer sh -> inner sh -> daemon. The outer shell exported
    # TORCHELASTIC_TIMER_FILE, as a login shell might: being the server's ancestor still rules it out.
    launcher = workers.track(
        subprocess.Popen(["sh", "-c", "sleep 120 & echo $!; wait"], stdout=subprocess.PIPE, text=True, env=_clean_env())
    )
    assert launcher.stdout is not None
    launched = Pinned(int(launcher.stdout.readline()))
    bystander = workers.track(subprocess.Popen(["sleep", "120"], env=_clean_env()))
    daemon_cmd = (
        f"{shlex.quote(sys.executable)} -m distinit.cli watchdog serve --path {tmp_path / 'wd'} --grace 0 "
        f"--events {events_file} --torch-fifo {fifo} --workers-of {launcher.pid}"
    )
    inner = f"{daemon_cmd} & echo $!; wait"
    outer = workers.track(
        subprocess.Popen(
            ["sh", "-c", f"sh -c {shlex.quote(inner)}; echo outer-done"],
            stdout=subprocess.PIPE,
            text=True,
            env=_clean_env(TORCHELASTIC_TIMER_FILE=fifo),
        )
    )
    assert outer.stdout is not None
    daemon = Pinned(int(outer.stdout.readline()))
    try:
        wait_for(lambda: os.path.exists(fifo) and stat.S_ISFIFO(os.lstat(fifo).st_mode), 60, "the daemon's FIFO")
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            for pid in (bystander.pid, outer.pid, launched.pid):
                _forge(fd, pid)
        finally:
            os.close(fd)
        # An honest, unchanged torch client launched as torchrun launches it (with the FIFO's path) still dies.
        worker = workers.track(
            subprocess.Popen(
                [sys.executable, FT_WORKER, "torch", fifo, "0.5"],
                stdout=subprocess.PIPE,
                text=True,
                env=_clean_env(OMP_NUM_THREADS="1", TORCHELASTIC_TIMER_FILE=fifo),
            )
        )
        assert read_json_line(worker, 90)["ready"]
        assert worker.wait(30) == -signal.SIGKILL
        assert wait_for(expired_for(events_file, worker.pid), 10, "the worker's event")["outcome"] == "killed"
        killed = wait_for(expired_for(events_file, launched.pid), 10, "the launched sleep's event")
        assert killed["outcome"] == "killed"  # a descendant of --workers-of: a worker
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(10)  # its child died: the launcher's `wait` returns
        for pid, why in ((bystander.pid, "not a worker of this job"), (outer.pid, "an ancestor of this server")):
            expired = wait_for(_event(events_file, "watchdog.expired", pid, "refused"), 10, f"pid {pid} refused")
            assert why in expired["detail"] and expired["signals"] == [] and expired["role"] is None
            rejected = wait_for(_event(events_file, "watchdog.rejected", pid, "refused"), 10, f"pid {pid} rejected")
            assert why in rejected["detail"]
        assert "TORCHELASTIC_TIMER_FILE" in expired_for(events_file, bystander.pid)()["detail"]  # what to do
        assert bystander.poll() is None
        os.kill(outer.pid, 0)  # alive: raises ProcessLookupError otherwise
        assert daemon.alive()
    finally:
        daemon.signal(signal.SIGTERM)
        launched.signal(signal.SIGKILL)
        daemon.close()
        launched.close()
    assert outer.wait(30) == 0


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timer.fifo")


@pytest.fixture
def server(fifo: str, events_file: Path) -> Iterator[FileTimerServer]:
    srv = FileTimerServer(fifo, "job", max_interval=5.0, events=str(events_file))
    srv.start()
    yield srv
    srv.stop()


def _hang_in(fifo: str, scope: str) -> None:
    FileTimerClient(fifo).acquire(scope, time.time() + 1.0)
    time.sleep(60)


def _join_killed(child: mp.process.BaseProcess, what: str) -> int | None:
    child.join(30)
    if child.exitcode is None:  # never leave it behind: stop it, by pid, and fail
        child.kill()
        child.join(10)
        pytest.fail(f"the worker (pid {child.pid}) {what} and was not killed within 30 s")
    return child.exitcode


def test_a_flood_of_timers_for_one_pid_leaves_room_for_an_honest_worker(
    server: FileTimerServer, workers: Workers, fifo: str, events_file: Path
) -> None:
    # The flood names a live process the server would signal (a child of the server's process): the worst
    # case, since a refused pid has a smaller budget still. 65,536 far-future timers, one scope each.
    target = workers.track(subprocess.Popen(["sleep", "120"]))
    flood = 65536
    far = time.time() + 3600

    def write_flood() -> None:
        fd = os.open(fifo, os.O_WRONLY)  # blocking: waits for room while the server reads
        try:
            for i in range(flood):
                _forge(fd, target.pid, f"flood-{i}", far)
        finally:
            os.close(fd)

    writer = threading.Thread(target=write_flood)
    started = time.monotonic()
    writer.start()
    writer.join(90)
    assert not writer.is_alive()
    wait_for(lambda: server._request_count >= flood, 60, "the server to read the flood")
    took = time.monotonic() - started
    held = sum(1 for pid, _ in server._timers if pid == target.pid)
    assert held == MAX_TIMERS_PER_PID
    rejected = [e for e in read_events(events_file) if e["event"] == "watchdog.rejected" and e["pid"] == target.pid]
    assert len(rejected) == 1 and "the most one process may hold" in rejected[0]["detail"]
    child = mp.get_context("fork").Process(target=_hang_in, args=(fifo, "honest"))
    child.start()
    assert _join_killed(child, "hung after a flood of another pid's timers") == -signal.SIGKILL
    assert wait_for(expired_for(events_file, child.pid or 0), 10, "the honest worker's event")["outcome"] == "killed"
    assert target.poll() is None  # its timers are far off: not signalled
    print(f"flood of {flood} lines read in {took:.2f} s")


def test_a_fifo_replaced_by_a_regular_file_is_reported_once_and_recreated(
    server: FileTimerServer, workers: Workers, fifo: str, events_file: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch.distributed.elastic.timer")
    first = os.lstat(fifo)
    planted = tmp_path / "planted"
    planted.write_text("")
    os.replace(planted, fifo)  # torch's client would now write its requests into this file, unread

    def replaced() -> list[dict[str, Any]]:
        return [e for e in read_events(events_file) if e["event"] == "watchdog.fifo_replaced"]

    (event,) = wait_for(replaced, 30, "the fifo_replaced event")
    assert "regular file" in event["detail"] and "a new FIFO was made" in event["detail"]
    now = os.lstat(fifo)
    assert stat.S_ISFIFO(now.st_mode) and now.st_ino != first.st_ino and stat.S_IMODE(now.st_mode) == 0o600
    worker = workers.track(
        subprocess.Popen(
            [sys.executable, FT_WORKER, "torch", fifo, "0.5"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_TIMER_FILE": fifo},
        )
    )
    assert read_json_line(worker, 90)["ready"]
    assert worker.wait(30) == -signal.SIGKILL  # served through the new FIFO
    wait_for(expired_for(events_file, worker.pid), 10, "the worker's event")
    assert len(replaced()) == 1  # said once


def test_a_refused_pid_is_refused_once_per_process_and_worker_parent_must_be_live(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="worker_parent"):
        FileTimerServer(str(tmp_path / "f"), "x", worker_parent=-5)
    server = FileTimerServer(str(tmp_path / "fifo"), "x", max_interval=5)
    try:
        for _ in range(3):
            server.register_timers([FileTimerRequest(1, "s", time.time() + 60, signal.SIGKILL)])
        assert server._procs[1] is None and 1 in server._refused
        assert server._per_pid[1] == 1
        server.register_timers([FileTimerRequest(1, "s", -1, 0)])
        assert 1 not in server._per_pid and server._refused_timers == 0
    finally:
        server.stop()
