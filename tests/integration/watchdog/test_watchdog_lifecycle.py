"""Server absent, killed and restarted, duplicated; the standalone daemon."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from wd_helpers import Workers, expired_for, read_events, read_json_line, start_daemon, wait_for

from distinit.errors import WatchdogError
from distinit.watchdog import WatchdogServer

pytestmark = pytest.mark.timeout(60)


def test_no_server_fails_open_at_constant_cost(workers: Workers, wd_dir: Path) -> None:
    began = time.monotonic()
    proc = workers.spawn({"DISTINIT_WATCHDOG": str(wd_dir)}, "completes", "0.2")
    ready = read_json_line(proc, 30)
    assert ready["registered"] is False
    assert "cannot reach the watchdog server" in ready["reason"]
    assert read_json_line(proc, 30) == {"completed": True}  # 101 regions ran unguarded, nothing raised
    assert proc.wait(20) == 0
    assert time.monotonic() - began < 15  # torch: 0.9 s and a raise per call with no server


def test_a_killed_worker_that_failed_open_leaves_no_stack_file(workers: Workers, wd_dir: Path) -> None:
    # Killed without running its atexit clean-up (a launcher's SIGKILL), with no server to clean up after
    # it: each such worker used to leave an empty <pid>.<start>.stack behind in /dev/shm.
    procs = [workers.spawn({"DISTINIT_WATCHDOG": str(wd_dir)}, "sleep", "60") for _ in range(3)]
    for proc in procs:
        assert read_json_line(proc, 30)["registered"] is False
    assert sorted(p.suffix for p in wd_dir.iterdir()) == [".slots"] * 3  # the tables a later server adopts
    for proc in procs:
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
    assert list(wd_dir.glob("*.stack")) == []


def test_fail_closed_raises_a_watchdog_error(wd_dir: Path) -> None:
    from distinit.watchdog import WatchdogClient

    with pytest.raises(WatchdogError) as caught:
        WatchdogClient(str(wd_dir), fail_closed=True)
    assert str(wd_dir) in str(caught.value)
    assert "distinit watchdog serve" in caught.value.fix


def test_restarted_server_resumes_armed_deadlines(workers: Workers, wd_dir: Path, tmp_path: Path) -> None:
    first_events, second_events = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first = start_daemon(workers, wd_dir, first_events)
    proc = workers.spawn({"DISTINIT_WATCHDOG": str(wd_dir)}, "sleep", "2.0")
    assert read_json_line(proc, 30)["registered"] is True
    os.kill(first.pid, signal.SIGKILL)  # no shutdown path runs: the socket file is left stale
    first.wait(10)
    second = start_daemon(workers, wd_dir, second_events)
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(second_events, proc.pid), 5, "the expired event from the new server")
    assert ev["server_pid"] == second.pid
    assert ev["scope"] == "sleep-hang"
    adopted = [e for e in read_events(second_events) if e["event"] == "watchdog.adopted"]
    assert [e["pid"] for e in adopted] == [proc.pid]
    assert not [e for e in read_events(first_events) if e["event"] == "watchdog.expired"]


def test_daemon_stops_cleanly_on_sigterm(workers: Workers, wd_dir: Path, events_file: Path) -> None:
    daemon = start_daemon(workers, wd_dir, events_file)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(15) == 0
    assert not (wd_dir / "sock").exists()
    assert not wd_dir.exists()  # it created the directory, left it empty, and removed it
    assert [e["event"] for e in read_events(events_file)] == ["watchdog.started", "watchdog.stopped"]


def test_a_directory_the_server_did_not_create_or_left_in_use_is_kept(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.mkdir(mode=0o700)
    users.chmod(0o700)
    WatchdogServer(str(users)).start().stop()
    assert users.is_dir()  # the user's own directory: never removed, even empty
    made = tmp_path / "made"
    server = WatchdogServer(str(made)).start()
    (made / "left.stack").write_text("a dump an event names")
    server.stop()
    assert (made / "left.stack").exists()  # not empty: kept
    replaced = tmp_path / "replaced"
    server = WatchdogServer(str(replaced)).start()
    os.rename(replaced, tmp_path / "moved")
    replaced.mkdir(mode=0o700)  # another directory under the name: not the one the server made
    server.stop()
    assert replaced.is_dir()


def test_second_server_on_one_path_is_refused(make_server: Callable[..., WatchdogServer], wd_dir: Path) -> None:
    make_server()
    with pytest.raises(WatchdogError, match="already serves"):
        WatchdogServer(str(wd_dir)).start()


def test_server_refuses_a_directory_others_can_enter(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    with pytest.raises(WatchdogError, match="0700") as caught:
        WatchdogServer(str(loose)).start()
    assert "chmod 700" in caught.value.fix


def test_stop_with_no_client_ever_returns_promptly(wd_dir: Path) -> None:
    server = WatchdogServer(str(wd_dir)).start()
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 2.0  # torch's FileTimerServer blocks forever in open() here
    assert not server.running


def test_server_started_after_the_worker_adopts_its_deadlines(
    make_server: Callable[..., WatchdogServer], workers: Workers, wd_dir: Path, events_file: Path
) -> None:
    env = {"DISTINIT_WATCHDOG": str(wd_dir), "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    proc = workers.spawn(env, "sleep", "2.0")
    ready = read_json_line(proc, 30)
    assert ready["registered"] is False  # failed open: no server yet
    make_server()  # same path, started late
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert (ev["scope"], ev["rank"], ev["local_rank"], ev["world_size"]) == ("sleep-hang", 5, 1, 8)
    adopted = [e for e in read_events(events_file) if e["event"] == "watchdog.adopted" and e["pid"] == proc.pid]
    assert [e["rank"] for e in adopted] == [5]  # no hello: the ranks came from the worker's table
