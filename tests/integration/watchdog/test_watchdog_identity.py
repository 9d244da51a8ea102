"""Identity comes from the kernel: reused pids and other users are never signalled."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests._pidns import UNSHARE_PID, own_pid_namespace_unavailable
from wd_helpers import WORKER, Workers, read_events, wait_for

from distinit.watchdog import WatchdogServer, _slots
from distinit.watchdog._ladder import LadderConfig, run_ladder
from distinit.watchdog._proc import ProcessRef, start_time

pytestmark = pytest.mark.timeout(60)


def bystander(workers: Workers, **popen: object) -> subprocess.Popen[str]:
    return workers.track(subprocess.Popen(["sleep", "60"], text=True, **popen))  # type: ignore[call-overload]


@pytest.mark.parametrize("use_pidfd", [pytest.param(True, id="pidfd"), pytest.param(False, id="procfs-start-time")])
def test_recorded_start_time_mismatch_never_signals(workers: Workers, use_pidfd: bool) -> None:
    """A handle whose recorded start time no longer matches the pid (the pid was reused) sends nothing."""
    victim = bystander(workers)
    real = start_time(victim.pid)
    assert real is not None
    assert ProcessRef.open(victim.pid, real + 1, use_pidfd=use_pidfd) is None  # refused at registration
    stale = ProcessRef(pid=victim.pid, start=real + 1)  # as if registered before the pid was recycled
    assert stale.send(signal.SIGKILL) is False
    result = run_ladder(stale, 0, None, LadderConfig(grace=0.0, dump_stacks=False))
    assert result.outcome == "exited"
    assert result.signals == []
    time.sleep(0.05)
    assert victim.poll() is None  # the bystander lives


def test_pidfd_outlives_the_pid(workers: Workers) -> None:
    """Once the worker is dead and reaped, its pidfd refuses to signal whatever holds the pid now."""
    worker = bystander(workers)
    ref = ProcessRef.open(worker.pid)
    assert ref is not None
    if ref.pidfd is None:
        pytest.skip("this kernel has no pidfd_open (Linux < 5.3); the procfs start-time path covers it")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    assert ref.send(signal.SIGKILL) is False
    ref.close()


# Runs as pid 1 of a pid namespace of its own: forcing a pid through ns_last_pid there moves no other process's
# counter (in the machine's namespace it handed concurrent tests' daemons numbers freed moments before). A worker
# registers a 1.5 s region and dies armed; `sleep` is started with its pid; the server must not signal it.
PID_REUSE = """
import json, os, signal, subprocess, sys, time
from distinit.watchdog import WatchdogServer

wd_dir, events, worker_script, use_pidfd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "pidfd"
server = WatchdogServer(wd_dir, grace=0.0, events=events, use_pidfd=use_pidfd).start()
env = {**os.environ, **server.env()}
worker = subprocess.Popen([sys.executable, worker_script, "sleep", "1.5"], env=env, stdout=subprocess.PIPE, text=True)
registered = json.loads(worker.stdout.readline())["registered"]
pid = worker.pid
os.kill(pid, signal.SIGKILL)  # dies armed; its deadline is still 1.5 s ahead
worker.wait()
victim = None
for _ in range(50):
    with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
        fh.write(str(pid - 1))
    proc = subprocess.Popen(["sleep", "60"])
    if proc.pid == pid:
        victim = proc
        break
    proc.kill()
    proc.wait()
if victim is not None:
    time.sleep(2.5)  # past the dead worker's deadline (and several server scans)
alive = victim is not None and victim.poll() is None
listed = pid in server.worker_pids()
server.stop()
found = {"registered": registered, "pid": pid, "victim": victim is not None, "alive": alive, "listed": listed}
print(json.dumps(found))
if victim is not None:
    victim.kill()
    victim.wait()
"""


@pytest.mark.parametrize("use_pidfd", [pytest.param(True, id="pidfd"), pytest.param(False, id="procfs-start-time")])
def test_forced_pid_reuse_never_kills_the_bystander(tmp_path: Path, use_pidfd: bool) -> None:
    reason = own_pid_namespace_unavailable()
    if reason is not None:
        pytest.skip(reason)
    script = tmp_path / "pid_reuse.py"
    script.write_text(PID_REUSE)
    events = tmp_path / "events.jsonl"
    argv = [str(tmp_path / "wd"), str(events), WORKER, "pidfd" if use_pidfd else "procfs"]
    out = subprocess.run([*UNSHARE_PID, sys.executable, str(script), *argv], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["registered"] is True, report
    if not report["victim"]:
        pytest.skip(f"could not recycle pid {report['pid']}: other processes took it first")
    assert report["alive"], "the watchdog killed a process that merely reused a worker's pid"
    assert not [e for e in read_events(events) if e["event"] == "watchdog.expired"]
    assert not report["listed"], report


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as user 'nobody'")
# The peer runs a system interpreter: the project's venv may sit under a directory only root can enter.
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)

_PEER = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"connect_error": exc.strerror}), flush=True)
    raise SystemExit(0)
try:
    s.sendall(b"DWDG1\\n")
except BrokenPipeError:
    pass  # a server that refuses at once may close before reading the hello
print(s.recv(4096).decode().strip(), flush=True)
"""


def _nobody() -> dict[str, int]:
    if SYSTEM_PYTHON is None:
        pytest.skip("no system python3 that user 'nobody' can run")
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine")
    return {"user": pw.pw_uid, "group": pw.pw_gid}


def _peer_as_nobody(socket_path: str) -> dict[str, object]:
    ids = _nobody()
    assert SYSTEM_PYTHON is not None
    out = subprocess.run(
        [SYSTEM_PYTHON, "-c", _PEER, socket_path],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        user=ids["user"],
        group=ids["group"],
    )
    assert out.returncode == 0, out.stderr
    reply: dict[str, object] = json.loads(out.stdout)
    return reply


@needs_root
def test_other_user_cannot_reach_a_private_server(make_server: Callable[..., WatchdogServer]) -> None:
    server = make_server()
    reply = _peer_as_nobody(server.socket_path)
    assert reply == {"connect_error": "Permission denied"}  # the 0700 directory stops it in the kernel
    assert server.worker_pids() == []


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A watchdog directory whose parents user nobody can traverse (pytest's tmp_path parents are 0700)."""
    parent = Path(tempfile.mkdtemp(prefix="distinit-wd-test-", dir="/tmp"))
    parent.chmod(0o711)
    yield parent / "wd"
    shutil.rmtree(parent, ignore_errors=True)


@needs_root
def test_server_rejects_another_uid_even_through_a_loosened_socket(reachable_dir: Path, events_file: Path) -> None:
    server = WatchdogServer(str(reachable_dir), events=str(events_file)).start()
    os.chmod(server.path, 0o711)  # a misconfiguration: the kernel's peer uid must still stop it
    os.chmod(server.socket_path, 0o666)
    reply = _peer_as_nobody(server.socket_path)
    nobody = _nobody()["user"]
    assert reply["ok"] is False
    assert f"peer uid {nobody}" in str(reply["error"])
    rejected = wait_for(
        lambda: [e for e in read_events(events_file) if e["event"] == "watchdog.rejected"], 5, "the rejection"
    )
    assert rejected[0]["uid"] == nobody
    assert server.worker_pids() == []
    server.stop()


@needs_root
def test_planted_slot_table_cannot_make_the_server_kill(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    """A table owned by another user, naming one of *our* processes with an expired deadline, is ignored."""
    server = make_server()
    victim = bystander(workers)
    start = start_time(victim.pid)
    assert start is not None
    table = Path(server.path) / f"{victim.pid}.{start}.slots"
    mm = _slots.create_table(str(table), victim.pid, start)
    memoryview(mm).cast("Q")[_slots.H_HWM] = 2
    memoryview(mm).cast("d")[_slots.HEADER_WORDS + _slots.SLOT_WORDS] = time.monotonic() - 1.0
    os.chown(table, _nobody()["user"], _nobody()["group"])  # as if user nobody had written it
    time.sleep(1.5)  # three directory scans
    mm.close()
    assert victim.poll() is None
    assert server.worker_pids() == []
    assert not [e for e in read_events(events_file) if e["event"] == "watchdog.expired"]
