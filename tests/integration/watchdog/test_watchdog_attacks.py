"""Hardening (issue 12, watchdog items): each attack runs for real; the server survives and still guards.

FIFOs, symlinks, truncation, idle connections, thread ids, shared process groups, planted tables, and
another user (a throw-away account created by the ``other_user`` fixture; skipped unless root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from wd_helpers import WORKER, Pinned, Workers, expired_for, read_events, read_json_line, wait_for

from conftest import OtherUser
from distinit.errors import WatchdogError
from distinit.watchdog import WatchdogClient, WatchdogServer, _slots
from distinit.watchdog._proc import start_time

pytestmark = pytest.mark.timeout(60)


def assert_still_enforces(server: WatchdogServer, workers: Workers, events_file: Path) -> None:
    """A worker that registers now and hangs is killed: the server thread is alive and not blocked."""
    proc = workers.spawn(server.env(), "sleep", "0.3")
    assert read_json_line(proc, 30)["registered"] is True
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert server.running


def plant_expired_table(path: Path, pid: int, start: int) -> None:
    """A valid slot table naming ``pid`` with one region 1 s past its deadline."""
    mm = _slots.create_table(str(path), pid, start)
    memoryview(mm).cast("Q")[_slots.H_HWM] = 2
    memoryview(mm).cast("d")[_slots.slot_base(1) + _slots.S_DEADLINE] = time.monotonic() - 1.0
    mm.close()


def table_name_for_a_bystander(workers: Workers, server: WatchdogServer) -> tuple[subprocess.Popen[str], Path]:
    """A live process that never used the watchdog, and the table name the server would read for it."""
    bystander = workers.track(subprocess.Popen(["sleep", "60"], text=True))
    start = start_time(bystander.pid)
    assert start is not None
    return bystander, Path(server.path) / _slots.slot_file_name(bystander.pid, start)


def expired_events(events_file: Path) -> list[dict[str, object]]:
    return [e for e in read_events(events_file) if e["event"] == "watchdog.expired"]


# ----------------------------------------------------------------------------- item 1
def test_second_client_is_refused_and_a_recreated_client_is_enforced(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    proc = workers.spawn(server.env(), "recreate", "0.5")
    ready = read_json_line(proc, 30)
    assert "already has an open WatchdogClient" in ready["second"]
    assert ready["registered"] is True
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["scope"] == "recreated"  # the new table is read, not the closed one


# ----------------------------------------------------------------------------- item 2
NON_ASCII_NAMES = ("².1.slots", "1.².slots", "١٢٣.4.slots", "9" * 40 + ".1.slots")


@pytest.mark.parametrize("when", ["before-start", "while-running"])
def test_non_ascii_digit_names_cannot_stop_the_server(
    make_server: Callable[..., WatchdogServer], workers: Workers, wd_dir: Path, events_file: Path, when: str
) -> None:
    if when == "before-start":
        wd_dir.mkdir(mode=0o700)
        for name in NON_ASCII_NAMES:
            (wd_dir / name).write_bytes(b"")
    server = make_server()  # `serve` used to crash here: int("²") raised in the first scan
    if when == "while-running":
        for name in NON_ASCII_NAMES:
            (wd_dir / name).write_bytes(b"")
        time.sleep(1.2)  # two scans: the server thread used to die in the first
    assert_still_enforces(server, workers, events_file)


# ----------------------------------------------------------------------------- item 3
def test_fifo_named_as_a_table_cannot_block_the_server(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    bystander, table = table_name_for_a_bystander(workers, server)
    os.mkfifo(table, 0o600)
    time.sleep(1.2)  # two scans: the server thread used to block in open() here, forever
    assert_still_enforces(server, workers, events_file)
    assert bystander.poll() is None


# ----------------------------------------------------------------------------- item 4
def test_truncating_a_watched_table_cannot_crash_the_server(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    victim = workers.spawn(server.env(), "sleep", "60")
    assert read_json_line(victim, 30)["registered"] is True
    (table,) = Path(server.path).glob(f"{victim.pid}.*.slots")
    os.truncate(table, 0)  # a mapped table would now SIGBUS the server (and this test process with it)

    def rejected() -> list[dict[str, object]]:
        return [e for e in read_events(events_file) if e["event"] == "watchdog.rejected" and e["pid"] == victim.pid]

    (note,) = wait_for(rejected, 5, "the note that the table became unreadable")
    assert "truncated" in str(note["detail"])
    assert_still_enforces(server, workers, events_file)


# ----------------------------------------------------------------------------- item 6
_SERVER = (
    "import sys, time\n"
    "from distinit.watchdog import WatchdogServer\n"
    "WatchdogServer(sys.argv[1], events=sys.argv[2], grace=0, use_pidfd=False).start()\n"
    "time.sleep(600)\n"
)
# The server's parent: one of its threads has a table (mapped by the process itself, armed and expired).
_PARENT = """
import json, os, subprocess, sys, threading, time
from distinit.watchdog import _slots
from distinit.watchdog._proc import start_time
ready, tids = threading.Event(), []
def hold():
    tids.append(threading.get_native_id())
    ready.set()
    time.sleep(600)
threading.Thread(target=hold, daemon=True).start()
ready.wait(10)
tid = tids[0]
server = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1], sys.argv[2]])
while not os.path.exists(os.path.join(sys.argv[1], "sock")):
    time.sleep(0.01)
mm = _slots.create_table(os.path.join(sys.argv[1], f"{tid}.{start_time(tid)}.slots"), tid, start_time(tid))
memoryview(mm).cast("Q")[_slots.H_HWM] = 2
memoryview(mm).cast("d")[_slots.slot_base(1) + _slots.S_DEADLINE] = time.monotonic() - 1.0
print(json.dumps({"tid": tid, "server": server.pid}), flush=True)
server.wait()
"""


def test_a_thread_id_of_the_servers_parent_is_never_signalled(
    workers: Workers, wd_dir: Path, events_file: Path
) -> None:
    parent = workers.track(
        subprocess.Popen(
            [sys.executable, "-c", _PARENT, str(wd_dir), str(events_file), _SERVER], stdout=subprocess.PIPE, text=True
        )
    )
    facts = read_json_line(parent, 30)
    server = Pinned(facts["server"])
    try:
        assert facts["tid"] != parent.pid
        time.sleep(1.5)  # three scans of a table naming the parent's thread, 1 s past its deadline
        assert parent.poll() is None, "the server signalled its parent through one of the parent's thread ids"
        assert expired_events(events_file) == []
    finally:
        server.signal(signal.SIGKILL)
        server.close()


# ----------------------------------------------------------------------------- item 8
_IDLE = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    held.append(s)
print("{}", flush=True)
time.sleep(600)
"""


def test_idle_connections_cannot_block_registration(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    idle = workers.track(
        subprocess.Popen([sys.executable, "-c", _IDLE, server.socket_path, "100"], stdout=subprocess.PIPE, text=True)
    )
    read_json_line(idle, 30)  # 100 connections that never send the hello (0.5 s of blocking each, before)
    assert_still_enforces(server, workers, events_file)  # registered within the client's 2 s connect timeout

    def dropped() -> list[dict[str, object]]:
        return [e for e in read_events(events_file) if e["event"] == "watchdog.rejected" and e["pid"] == idle.pid]

    wait_for(lambda: len(dropped()) == 100, 10, "every idle connection to be dropped")


# ----------------------------------------------------------------------------- item 7
_LAUNCHER = """
import json, subprocess, sys, time
hung = subprocess.Popen([sys.executable, sys.argv[1], "sleep", "0.4"], stdout=subprocess.PIPE, text=True)
sibling = subprocess.Popen(["sleep", "600"])
ready = json.loads(hung.stdout.readline())
print(json.dumps({"hung": hung.pid, "sibling": sibling.pid, "registered": ready["registered"]}), flush=True)
hung.wait()
time.sleep(600)
"""


def test_kill_group_spares_a_group_the_worker_does_not_lead(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server(kill_group=True)
    launcher = workers.track(
        subprocess.Popen(  # like mp.spawn or a Popen supervisor: the ranks share the launcher's group
            [sys.executable, "-c", _LAUNCHER, WORKER],
            env={**os.environ, **server.env()},
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    )
    facts = read_json_line(launcher, 30)
    sibling = Pinned(facts["sibling"])
    try:
        assert facts["registered"] is True
        ev = wait_for(expired_for(events_file, facts["hung"]), 20, "the expired event")
        assert ev["outcome"] == "killed"
        assert "does not lead its process group" in ev["detail"]
        time.sleep(0.2)
        assert launcher.poll() is None, "the launcher was killed with the worker's group"
        assert sibling.alive(), "a healthy sibling rank was killed"
    finally:
        sibling.signal(signal.SIGKILL)
        sibling.close()


# ----------------------------------------------------------------------------- item 9
def test_a_table_planted_for_a_process_that_never_used_the_watchdog_is_ignored(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    bystander, table = table_name_for_a_bystander(workers, server)
    plant_expired_table(table, bystander.pid, start_time(bystander.pid) or 0)  # by the same uid
    time.sleep(1.5)  # three scans
    assert bystander.poll() is None, "a planted table made the server kill a process that never registered"
    assert expired_events(events_file) == []
    assert server.worker_pids() == []


# ----------------------------------------------------------------------------- item 5
def test_events_file_pre_created_by_another_user_is_refused(
    other_user: OtherUser, shared_tmp: Path, tmp_path: Path
) -> None:
    events = shared_tmp / "events.jsonl"
    made = other_user.run(
        "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666)); os.chmod(sys.argv[1], 0o666)",
        str(events),
    )
    assert made.returncode == 0, made.stderr
    with pytest.raises(WatchdogError, match="events file") as caught:
        WatchdogServer(str(tmp_path / "wd"), events=str(events)).start()
    assert str(events) in str(caught.value)
    assert events.read_text() == ""  # nothing written where that user can read it
    assert not (tmp_path / "wd" / "sock").exists()


def test_events_symlink_planted_by_another_user_is_not_followed(
    other_user: OtherUser, shared_tmp: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = shared_tmp / "events.jsonl"
    made = other_user.run("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(victim), str(link))
    assert made.returncode == 0, made.stderr
    with pytest.raises(WatchdogError, match="cannot open the events file"):
        WatchdogServer(str(tmp_path / "wd"), events=str(link)).start()
    assert victim.read_text() == "precious\n"


@pytest.mark.timeout(30)
def test_events_fifo_planted_by_another_user_cannot_block_serve(
    other_user: OtherUser, shared_tmp: Path, tmp_path: Path
) -> None:
    fifo = shared_tmp / "events.jsonl"
    made = other_user.run("import os, sys; os.mkfifo(sys.argv[1], 0o666)", str(fifo))
    assert made.returncode == 0, made.stderr
    began = time.monotonic()
    with pytest.raises(WatchdogError, match="events file"):
        WatchdogServer(str(tmp_path / "wd"), events=str(fifo)).start()  # used to block in open() for ever
    assert time.monotonic() - began < 5


def test_events_fifo_with_a_reader_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # an attacker listening for every event
    try:
        with pytest.raises(WatchdogError, match="not a regular file"):
            WatchdogServer(str(tmp_path / "wd"), events=str(fifo)).start()
    finally:
        os.close(reader)


# ----------------------------------------------------------------------------- item 10
def test_directory_pre_created_by_another_user_is_reported_with_its_owner(
    other_user: OtherUser, shared_tmp: Path
) -> None:
    path = shared_tmp / "wd"
    made = other_user.run("import os, sys; os.mkdir(sys.argv[1], 0o700)", str(path))
    assert made.returncode == 0, made.stderr
    owner = f"uid {other_user.uid} ({other_user.name})"
    with pytest.raises(WatchdogError) as caught:
        WatchdogServer(str(path)).start()
    assert owner in caught.value.what
    assert "another user created it first" in caught.value.what
    assert "$XDG_RUNTIME_DIR" in caught.value.fix
    client = WatchdogClient(str(path), dump_stacks=False)  # fails open, and says why
    try:
        assert owner in client.reason
    finally:
        client.close()


def test_a_server_never_runs_in_a_directory_another_user_owns(
    other_user: OtherUser, shared_tmp: Path, workers: Workers
) -> None:
    """`distinit watchdog serve` exits 2 naming the owner, instead of serving a directory it does not control."""
    path = shared_tmp / "wd"
    other_user.run("import os, sys; os.mkdir(sys.argv[1], 0o777)", str(path))
    run = subprocess.run(
        [sys.executable, "-m", "distinit.cli", "watchdog", "serve", "--path", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert other_user.name in run.stderr
    assert not (path / "sock").exists()
