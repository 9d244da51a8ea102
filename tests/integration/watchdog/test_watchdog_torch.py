"""With torch: a worker blocked in a gloo collective, and torchrun restarting the worker we killed."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from wd_helpers import Workers, expired_for, read_events, read_json_line, start_daemon, torchrun_path, wait_for

from distinit.watchdog import WatchdogServer

TORCHRUN_SCRIPT = str(Path(__file__).with_name("wd_torchrun.py"))


@pytest.mark.timeout(90)
def test_worker_blocked_in_gloo_collective_is_dumped_and_killed(
    make_server: object, workers: Workers, events_file: Path, tmp_path: Path
) -> None:
    assert callable(make_server)
    server: WatchdogServer = make_server()
    store = str(tmp_path / "store")
    hung = workers.spawn(server.env(), "gloo", "2.0", "0", store)
    peer = workers.spawn(server.env(), "gloo", "2.0", "1", store)
    assert read_json_line(hung, 60)["registered"] is True
    read_json_line(peer, 60)
    assert hung.wait(30) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, hung.pid), 5, "the expired event")
    assert ev["scope"] == "barrier"
    assert " in barrier" in ev["stack"]  # torch.distributed's barrier frame, captured while blocked in gloo
    assert peer.poll() is None  # only the worker whose region overran is touched


@pytest.mark.timeout(150)
@pytest.mark.skipif(torchrun_path() is None, reason="torchrun is not installed beside this interpreter")
def test_torchrun_restarts_the_killed_worker_and_the_retry_completes(
    workers: Workers, wd_dir: Path, events_file: Path, tmp_path: Path
) -> None:
    daemon = start_daemon(workers, wd_dir, events_file)  # beside the agent, as `distinit watchdog serve`
    out = tmp_path / "out"
    out.mkdir()
    torchrun = torchrun_path()
    assert torchrun is not None
    run = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--monitor-interval",
            "0.1",
            TORCHRUN_SCRIPT,
            str(out),
        ],
        env={**os.environ, "DISTINIT_WATCHDOG": str(wd_dir), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in out.glob("done-*")) == ["done-1-0", "done-1-1"]  # the retry completed
    hung_pid = int((out / "pid-0-1").read_text())
    expired = [e for e in read_events(events_file) if e["event"] == "watchdog.expired"]
    assert [(e["pid"], e["scope"], e["outcome"]) for e in expired] == [(hung_pid, "step-attempt0", "killed")]
    assert daemon.poll() is None  # the watchdog (and the agent, rc 0 above) survived the kill
