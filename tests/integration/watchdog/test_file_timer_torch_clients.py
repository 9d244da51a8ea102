"""Unchanged torch ``FileTimerClient`` workers (real processes) served by distinit's ``FileTimerServer``.

A hung worker dies of its own signal (after a stack dump when its client installed the handler), an expiry is
noticed at its deadline, a reused pid is never signalled, hostile FIFO writes never stop the server, and
under torchrun the daemon takes the agent's place as the job's FileTimer server.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests._pidns import UNSHARE_PID, own_pid_namespace_unavailable
from wd_helpers import Pinned, Workers, expired_for, read_events, read_json_line, torchrun_path, wait_for

from distinit.watchdog._proc import start_time
from distinit.watchdog._timer_client import stack_path
from distinit.watchdog.elastic import FileTimerClient, FileTimerServer, configure, expires

FT_WORKER = str(Path(__file__).with_name("ft_worker.py"))
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# Much longer than any deadline below: an expiry noticed only at the end of an interval would show.
MAX_INTERVAL = 5.0
TORCHRUN_TAIL = ("--monitor-interval", "0.1", FT_WORKER, "torch", "-", "1.0")

pytestmark = pytest.mark.timeout(120)


def spawn(workers: Workers, kind: str, fifo: str, after: float, *extra: str) -> subprocess.Popen[str]:
    if kind == "torch":
        pytest.importorskip("torch.distributed.elastic.timer")
    return workers.track(
        subprocess.Popen(
            [sys.executable, FT_WORKER, kind, fifo, str(after), *extra],
            stdout=subprocess.PIPE,
            text=True,
            # As torchrun launches them: the daemon signals only processes that started with the FIFO's path
            # (or hold it open, or descend from the server or --workers-of), and torch's client closes it.
            env={**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_TIMER_FILE": fifo},
        )
    )


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timer.fifo")


@pytest.fixture
def server(fifo: str, events_file: Path) -> Iterator[FileTimerServer]:
    srv = FileTimerServer(fifo, "job", max_interval=MAX_INTERVAL, events=str(events_file))
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("kind", ["torch", "distinit"])
def test_a_hung_worker_dies_of_its_signal_at_its_deadline(
    server: FileTimerServer, workers: Workers, fifo: str, events_file: Path, kind: str
) -> None:
    worker = spawn(workers, kind, fifo, 0.5)
    assert read_json_line(worker, 90)["ready"]
    assert worker.wait(30) == -signal.SIGKILL  # torch's default signal: exit status -9
    event = wait_for(expired_for(events_file, worker.pid), 10, "the expired event")
    assert (event["outcome"], event["signals"], event["scope"]) == ("killed", ["SIGKILL"], "step-attempt0")
    assert event["overshoot_s"] < MAX_INTERVAL / 2  # noticed at the deadline, not at the interval's end
    if kind == "distinit":  # the drop-in client installs the dump handler: the stack comes first
        assert 'ft_worker.py", line' in event["stack"]
        assert os.path.exists(event["stack_file"])  # kept: the event (and the log line) names it
    else:  # an unchanged torch client has no handler: the dump signal would kill it, so none is sent
        assert event["stack"] is None
    assert server._watchdog_thread is not None and server._watchdog_thread.is_alive()


def test_the_requested_signal_is_the_one_sent(server: FileTimerServer, workers: Workers, fifo: str) -> None:
    worker = spawn(workers, "torch", fifo, 0.5, str(int(signal.SIGTERM)))
    assert read_json_line(worker, 90)["ready"]
    assert worker.wait(30) == -signal.SIGTERM


def _serve_behind_a_shell(workers: Workers, tmp_path: Path, fifo: str, events: Path) -> tuple[Pinned, int]:
    """``distinit watchdog serve --torch-fifo`` as the child of a shell: (the daemon, its parent's pid).

    The daemon's parent is the shell, not this test process, so a failure to protect "the parent" could
    never kill pytest.
    """
    cmd = (
        f"{sys.executable} -m distinit.cli watchdog serve --path {tmp_path / 'wd'} --grace 0 "
        f"--events {events} --torch-fifo {fifo} & echo $!; wait"
    )
    shell = workers.track(subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, text=True))
    assert shell.stdout is not None
    daemon = Pinned(int(shell.stdout.readline()))
    wait_for(lambda: os.path.exists(fifo) and stat.S_ISFIFO(os.lstat(fifo).st_mode), 30, "the daemon's FIFO")
    return daemon, shell.pid


def test_hostile_fifo_writes_never_stop_the_daemon_nor_kill_what_they_name(
    workers: Workers, tmp_path: Path, fifo: str, events_file: Path
) -> None:
    pinned, shell = _serve_behind_a_shell(workers, tmp_path, fifo, events_file)
    daemon = pinned.pid
    # A process group of its own (never this test's: a kill(-pgid) gone wrong must not reach pytest). pid 0
    # and -1 (the caller's group, every process of the user) are refused by the same rule (pid > 0), which
    # tests/unit/watchdog/test_file_timer_requests.py checks without risking the machine.
    grouped = workers.track(subprocess.Popen(["sleep", "60"], start_new_session=True))
    try:
        past = time.time() - 1

        def forged(pid: object, **over: object) -> bytes:
            doc = {"version": 1, "pid": pid, "scope_id": "forged", "expiration_time": past, "signal": 9, **over}
            return json.dumps(doc).encode() + b"\n"

        hostile = [
            b"not json\n",
            b"[" * 4000 + b"\n",  # nesting: a RecursionError in a naive reader
            b"x" * 20000 + b"\n",  # longer than PIPE_BUF
            b'"a string"\n',
            b"\xff\xfe\x00\n",
            b'{"version": 1, "pid": 5, "scope_id": "s", "expiration_time": NaN, "signal": 9}\n',
            forged("12"),
            forged(True),
            forged(daemon, signal=999),
            forged(daemon, version=2),
            forged(daemon, scope_id={"a": 1}),
            forged(daemon, scope_id="\u00e9\n\x00" * 50),  # kept, escaped to ASCII
            forged(daemon),  # the server's own process
            forged(shell),  # its parent
            forged(1),
            forged(-grouped.pid),  # a process group: kill(-pgid) would signal all of it
        ]
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            for line in hostile:
                os.write(fd, line)
        finally:
            os.close(fd)
        worker = spawn(workers, "torch", fifo, 0.5)  # an honest torch client is still served
        assert read_json_line(worker, 90)["ready"]
        assert worker.wait(30) == -signal.SIGKILL
        wait_for(expired_for(events_file, worker.pid), 10, "the honest worker's expired event")
        assert pinned.alive()
        os.kill(shell, 0)  # alive: raises ProcessLookupError otherwise
        assert grouped.poll() is None
        refused = {e["pid"]: e for e in read_events(events_file) if e.get("outcome") == "refused"}
        assert {daemon, shell, 1, -grouped.pid} <= set(refused)
        assert all(e["signals"] == [] for e in refused.values())
        assert "\\xe9\\n\\x00" in refused[daemon]["scope"]
    finally:
        pinned.signal(signal.SIGTERM)
        pinned.close()
    shell_proc = next(p for p in workers.procs if p.pid == shell)
    assert shell_proc.wait(30) == 0  # the daemon stopped cleanly on SIGTERM (status 0), so its shell did


# Runs as pid 1 of a pid namespace of its own, so forcing a pid through ns_last_pid races with nothing
# else. An unchanged torch client acquires a 3 s timer and is SIGKILLed; `sleep` is started with its pid;
# the server must not signal the bystander when the dead worker's timer expires.
PID_REUSE = """
import json, os, signal, subprocess, sys, time
from distinit.watchdog._proc import start_time
from distinit.watchdog._timer_client import stack_path
from distinit.watchdog.elastic import FileTimerClient, FileTimerServer

fifo, events, worker_script = sys.argv[1], sys.argv[2], sys.argv[3]
server = FileTimerServer(fifo, "reuse", max_interval=1.0, events=events)
server.start()
worker = subprocess.Popen([sys.executable, worker_script, "torch", fifo, "3"], stdout=subprocess.PIPE, text=True)
json.loads(worker.stdout.readline())
# The kill waits for the server to have identified the worker (pidfd + start time) from its acquire line: a
# line read only after the worker died would be swept as an exited worker's, and one read after the pid was
# reused would name the new process (torch's request carries no start time).
until = time.monotonic() + 60
while server._procs.get(worker.pid) is None:
    assert time.monotonic() < until, "the server never read the acquire line"
    time.sleep(0.01)
os.kill(worker.pid, signal.SIGKILL)
worker.wait()
bystander = None
for _ in range(50):
    with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
        fh.write(str(worker.pid - 1))
    proc = subprocess.Popen(["sleep", "60"])
    if proc.pid == worker.pid:
        bystander = proc
        break
    proc.kill()
    proc.wait()
until = time.monotonic() + 60  # the timer expires 3 s after the acquire: wait for its event, not a clock
while bystander is not None and '"watchdog.expired"' not in (open(events).read() if os.path.exists(events) else ""):
    assert time.monotonic() < until, "the timer never expired"
    time.sleep(0.05)
server.stop()
alive = bystander is not None and bystander.poll() is None
print(json.dumps({"worker": worker.pid, "bystander": bystander and bystander.pid, "alive": alive}))
if bystander is not None:
    bystander.kill()
"""


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    reason = own_pid_namespace_unavailable()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch.distributed.elastic.timer")
    script = tmp_path / "pid_reuse.py"
    script.write_text(PID_REUSE)
    events = tmp_path / "events.jsonl"
    out = subprocess.run(
        [
            *UNSHARE_PID,
            sys.executable,
            str(script),
            *(str(tmp_path / "fifo"),),
            str(events),
            FT_WORKER,
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if report["bystander"] is None:
        pytest.skip(f"could not recycle pid {report['worker']}: other processes took it first")
    assert report["alive"], "the server signalled a process that merely reused a worker's pid"
    expired = [e for e in read_events(events) if e["event"] == "watchdog.expired"]
    assert [(e["pid"], e["outcome"], e["signals"]) for e in expired] == [(report["worker"], "refused", [])]
    assert "now names another process" in expired[0]["detail"]


@pytest.mark.timeout(180)
@pytest.mark.skipif(torchrun_path() is None, reason="torchrun is not installed beside this interpreter")
def test_under_torchrun_the_daemon_takes_the_agents_place(
    workers: Workers, tmp_path: Path, fifo: str, events_file: Path
) -> None:
    # TORCHELASTIC_TIMER_FILE is exported and TORCHELASTIC_ENABLE_FILE_TIMER is not: the agent starts no
    # FileTimerServer of its own (with it set, the agent would replace the FIFO with its own server), and the
    # workers' unchanged code reads the path and talks to the daemon. Restart 0 hangs and dies of SIGKILL;
    # the agent survives (torch's server would have SIGKILLed it, its host) and restart 1 completes.
    pytest.importorskip("torch.distributed.elastic.timer")
    daemon, _ = _serve_behind_a_shell(workers, tmp_path, fifo, events_file)
    torchrun = torchrun_path()
    assert torchrun is not None
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_ENABLE_FILE_TIMER"}
    try:
        run = subprocess.run(
            [torchrun, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1", *TORCHRUN_TAIL],
            env={**env, "TORCHELASTIC_TIMER_FILE": fifo, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        attempts = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        assert [a["attempt"] for a in attempts] == [0, 1]
        expired = [e for e in read_events(events_file) if e["event"] == "watchdog.expired"]
        assert [(e["pid"], e["scope"], e["outcome"]) for e in expired] == [
            (attempts[0]["pid"], "step-attempt0", "killed")
        ]
        assert daemon.alive()  # the daemon survived too
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.close()


def _acquire_in_child(client: object) -> None:
    assert isinstance(client, FileTimerClient)
    client.acquire("child", time.time() + 60)
    client.release("child")
    client.close()


def test_a_client_used_after_fork_dumps_into_its_own_file_and_leaves_the_parents(
    server: FileTimerServer, fifo: str
) -> None:
    client = FileTimerClient(fifo)
    client.acquire("parent", time.time() + 60)
    ours = stack_path(fifo, os.getpid(), start_time(os.getpid()) or 0)
    assert os.path.exists(ours)
    child = mp.get_context("fork").Process(target=_acquire_in_child, args=(client,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert os.path.exists(ours)  # the child's close removed its own stack file, not this process's
    assert not [p for p in os.listdir(os.path.dirname(fifo)) if p.startswith(f"timer.fifo.{child.pid}.")]
    client.release("parent")
    client.close()
    assert not os.path.exists(ours)


def _two_scopes_then_hang(fifo: str, hung: str, released: str) -> None:
    client = FileTimerClient(fifo)
    client.acquire(hung, time.time() + 0.5)
    client.acquire(released, time.time() + 60)
    client.release(released)
    time.sleep(60)  # hung in ``hung``: its timer must still be armed


@pytest.mark.parametrize(
    "prefix",
    [pytest.param("x" * 1500, id="long"), pytest.param("\u00e9" * 300, id="non-ascii")],
)
def test_scopes_that_differ_only_past_the_kept_length_stay_apart(
    server: FileTimerServer, fifo: str, prefix: str
) -> None:
    # Found by attack: scope ids were cut to 1024 kept characters (a non-ASCII character is kept as 4), so
    # two long scopes of one worker shared a timer: releasing one disarmed the other and a hung worker
    # ran unguarded. torch keys by the whole scope id.
    child = mp.get_context("fork").Process(target=_two_scopes_then_hang, args=(fifo, prefix + "A", prefix + "B"))
    child.start()
    child.join(30)
    if child.exitcode is None:  # never leave it behind: stop it, by pid, and fail
        child.kill()
        child.join(10)
        pytest.fail(f"the worker (pid {child.pid}) hung in its armed scope for 30 s and was not killed")
    assert child.exitcode == -signal.SIGKILL


def _hang_in(fifo: str, scope: str) -> None:
    FileTimerClient(fifo).acquire(scope, time.time() + 0.5)
    time.sleep(60)


def _join_killed(child: mp.process.BaseProcess, what: str) -> int | None:
    child.join(30)
    if child.exitcode is None:  # never leave it behind: stop it, by pid, and fail
        child.kill()
        child.join(10)
        pytest.fail(f"the worker (pid {child.pid}) {what} and was not killed within 30 s")
    return child.exitcode


def test_half_a_line_held_open_does_not_swallow_the_next_request(server: FileTimerServer, fifo: str) -> None:
    # Found by attack: a writer that leaves half a line and keeps the FIFO open made the server read the
    # next client's whole acquire as the end of that line, refuse it as bad JSON, and leave a hung worker
    # unguarded. torch's server does the same.
    hostile = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(hostile, b'{"version": 1, "pid": 12')
        child = mp.get_context("fork").Process(target=_hang_in, args=(fifo, "step"))
        child.start()
        assert _join_killed(child, "hung after a half line") == -signal.SIGKILL
        os.write(hostile, b"x" * (3 * select.PIPE_BUF))  # past the longest line: the server drops it unread
        child = mp.get_context("fork").Process(target=_hang_in, args=(fifo, "step"))
        child.start()
        assert _join_killed(child, "hung after an overlong half line") == -signal.SIGKILL
    finally:
        os.close(hostile)


def test_stopping_a_replaced_server_leaves_its_successors_fifo(fifo: str) -> None:
    # Found by attack: a second server on the same path replaces the FIFO (as torch's does), and the first
    # one's stop() then removed the second one's FIFO, so every later client got BrokenPipeError.
    first = FileTimerServer(fifo, "job", max_interval=MAX_INTERVAL)
    first.start()
    second = FileTimerServer(fifo, "job", max_interval=MAX_INTERVAL)
    second.start()
    try:
        first.stop()
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        child = mp.get_context("fork").Process(target=_hang_in, args=(fifo, "step"))
        child.start()
        assert _join_killed(child, "hung under the second server") == -signal.SIGKILL
    finally:
        second.stop()
    assert not os.path.exists(fifo)


def _threads_share_one_client(fifo: str) -> None:
    errors: list[str] = []

    def regions(i: int) -> None:
        try:
            for _ in range(300):
                with expires(after=30, scope=f"thread-{i}"):
                    pass
        except Exception as exc:  # the test reads them from the exit status
            errors.append(repr(exc))

    configure(FileTimerClient(fifo))
    threads = [threading.Thread(target=regions, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    os._exit(3 if errors else 0)


def test_a_client_shared_by_threads_waits_for_room_in_a_full_fifo(server: FileTimerServer, fifo: str) -> None:
    # Found by attack: eight threads of one worker through one client, the FIFO full; a thread woken when
    # room appeared lost it to another thread and raised BrokenPipeError after a single retry, though the
    # server was reading. A one-page FIFO makes the contention certain.
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, 4096)
    finally:
        os.close(fd)
    child = mp.get_context("fork").Process(target=_threads_share_one_client, args=(fifo,))
    child.start()
    child.join(60)
    if child.exitcode is None:
        child.kill()
        child.join(10)
        pytest.fail(f"the worker (pid {child.pid}) did not finish 4800 requests in 60 s")
    assert child.exitcode == 0, "a thread's request failed: the FIFO was full and the client gave up"


def test_a_worker_idle_between_regions_keeps_its_stack_file_for_its_next_hang(
    server: FileTimerServer, workers: Workers, fifo: str, events_file: Path
) -> None:
    # The drop-in worker ends one region, stays idle while the server sweeps its released timers, then hangs:
    # the server must still ask it for its stack (the sweep once removed a live worker's stack file with its
    # process handle, and the hang was reaped with "no stack").
    proc = workers.track(
        subprocess.Popen(
            [sys.executable, FT_WORKER, "distinit", fifo, "0.3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "FT_WORKER_WARMUP": "1", "FT_WORKER_GATE": "1"},
        )
    )
    assert read_json_line(proc, 90)["gate"]
    released = time.monotonic()
    wait_for(lambda: (server._swept_at > released and not server._timers) or None, 30, "a sweep after the release")
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert read_json_line(proc, 30)["ready"]
    event = wait_for(expired_for(events_file, proc.pid), 30, "the expired event")
    assert event["outcome"] == "killed", event
    assert 'ft_worker.py", line' in (event["stack"] or ""), event["detail"]
