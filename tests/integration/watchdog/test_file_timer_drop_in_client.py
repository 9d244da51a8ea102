"""The drop-in client (``distinit.watchdog.elastic``) under torch's ``FileTimerServer`` and distinit's (real processes).

torch's server reads with a blocking ``readline()`` and reaps only between reads, so the drop-in closes the
FIFO after every request unless distinit's server's marker names the FIFO: a hung drop-in worker is reaped
as fast as a hung torch worker, under torchrun's own timer too. A worker that ends normally leaves nothing
beside the FIFO.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wd_helpers import Workers, read_json_line, torchrun_path

from distinit.watchdog._timer_client import marker_path, publish_marker, withdraw_marker
from distinit.watchdog._timer_server import make_fifo
from distinit.watchdog.elastic import FileTimerServer

FT_WORKER = str(Path(__file__).with_name("ft_worker.py"))
# torch's client is reaped within this of its deadline under torchrun's own timer (max_interval 0.1 s); the
# drop-in must be too (issue 31: it was reaped only when it stopped hanging, about a minute later).
REAPED_WITHIN = 1.0
TORCHRUN = ("--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--monitor-interval", "0.1")

pytestmark = pytest.mark.timeout(120)


def _wait_exit(pidfd: int, pid: int, timeout: float) -> float:
    """``time.time()`` at which the process behind ``pidfd`` exited (pidfd poll); fails after ``timeout`` s."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # through the pidfd: never a reused pid
        pytest.fail(f"worker {pid} was still alive {timeout} s after it hung: its timer was never acted on")
    return time.time()


def _stack_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".stack"))


@pytest.mark.timeout(240)
@pytest.mark.skipif(torchrun_path() is None, reason="torchrun is not installed beside this interpreter")
@pytest.mark.parametrize("kind", ["distinit", "torch"])
def test_under_torchruns_own_timer_a_hung_worker_is_killed_within_a_second_of_its_deadline(
    workers: Workers, tmp_path: Path, kind: str
) -> None:
    # TORCHELASTIC_ENABLE_FILE_TIMER=1: the agent runs torch's FileTimerServer (max_interval 0.1 s) on the
    # FIFO. The worker stops at a gate until this test holds a pidfd on it, so its death is seen whenever it
    # comes (no race with a fast reap, no reused pid), then hangs in expires(after=1.0) for 600 s.
    pytest.importorskip("torch.distributed.elastic.timer")
    torchrun = torchrun_path()
    assert torchrun is not None
    fifo = tmp_path / "timer.fifo"
    env = {
        **os.environ,
        "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
        "TORCHELASTIC_TIMER_FILE": str(fifo),
        "FT_WORKER_GATE": "1",
        "OMP_NUM_THREADS": "1",
    }
    with open(tmp_path / "torchrun.err", "w") as err:
        run = workers.track(
            subprocess.Popen(
                [torchrun, *TORCHRUN, FT_WORKER, kind, "-", "1.0"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        )
    gate = read_json_line(run, 150)
    pidfd = os.pidfd_open(gate["pid"])
    try:
        assert run.stdin is not None
        run.stdin.write("go\n")
        run.stdin.flush()
        ready = read_json_line(run, 60)
        assert ready["pid"] == gate["pid"]
        died = _wait_exit(pidfd, gate["pid"], 60)
    finally:
        os.close(pidfd)
    late = died - ready["deadline"]
    assert late <= REAPED_WITHIN, (
        f"reaped {late:.2f} s after its deadline; torchrun said:\n" + (tmp_path / "torchrun.err").read_text()[-3000:]
    )
    # torch 2.13's server sends the reaped worker's signal to its own process, the agent: its SIGKILL says the
    # worker was reaped by the timer, with the signal it asked for.
    assert run.wait(60) == -signal.SIGKILL
    assert ready["stack_files"] == []  # torch's server never asks for a dump: no handler, no file
    assert _stack_files(tmp_path) == []


@pytest.fixture
def torch_server(tmp_path: Path) -> Iterator[str]:
    timer = pytest.importorskip("torch.distributed.elastic.timer")
    fifo = str(tmp_path / "timer.fifo")
    srv = timer.FileTimerServer(fifo, "job", max_interval=0.1)
    srv.start()
    yield fifo
    srv.stop()


@pytest.fixture
def distinit_server(tmp_path: Path) -> Iterator[str]:
    fifo = str(tmp_path / "timer.fifo")
    srv = FileTimerServer(fifo, "job", max_interval=0.1)
    srv.start()
    yield fifo
    srv.stop()


@pytest.fixture
def marked_fifo(tmp_path: Path) -> Iterator[str]:
    """A FIFO with distinit's marker and a reader that never sweeps: only the client can remove its files."""
    fifo = str(tmp_path / "timer.fifo")
    rfd, wfd = make_fifo(fifo)
    marker = publish_marker(fifo, os.fstat(rfd))
    yield fifo
    withdraw_marker(fifo, marker)
    os.close(rfd)
    os.close(wfd)


def _run_to_the_end(workers: Workers, fifo: str) -> dict[str, Any]:
    """A drop-in worker that completes its region and exits normally (restart 1): its ready line."""
    worker = workers.track(
        subprocess.Popen(
            [sys.executable, FT_WORKER, "distinit", fifo, "60"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "TORCHELASTIC_RESTART_COUNT": "1", "OMP_NUM_THREADS": "1"},
        )
    )
    ready = read_json_line(worker, 90)
    assert worker.wait(60) == 0
    return ready


def test_a_worker_that_ends_normally_removes_its_own_stack_file(
    workers: Workers, tmp_path: Path, marked_fifo: str
) -> None:
    ready = _run_to_the_end(workers, marked_fifo)
    (armed,) = ready["stack_files"]  # while the region ran: its dump file, for distinit's server
    assert armed.startswith(f"timer.fifo.{ready['pid']}.")
    assert _stack_files(tmp_path) == []


def test_a_worker_that_ends_normally_leaves_no_stack_file_under_distinits_server(
    workers: Workers, tmp_path: Path, distinit_server: str
) -> None:
    assert os.path.exists(marker_path(distinit_server))  # the server says it is distinit's
    ready = _run_to_the_end(workers, distinit_server)
    (armed,) = ready["stack_files"]  # while the region ran: its dump file, for distinit's server
    assert armed.startswith(f"timer.fifo.{ready['pid']}.")
    assert _stack_files(tmp_path) == []


def test_a_worker_that_ends_normally_leaves_no_stack_file_under_torchs_server(
    workers: Workers, tmp_path: Path, torch_server: str
) -> None:
    ready = _run_to_the_end(workers, torch_server)
    assert ready["stack_files"] == []  # none is made: torch's server never asks for a dump
    assert _stack_files(tmp_path) == []
