"""A hung worker is stack-dumped and killed; everything else is left alone."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from wd_helpers import WORKER, Pinned, Workers, expired_for, read_events, read_json_line, wait_for

from distinit.watchdog import WatchdogServer

pytestmark = pytest.mark.timeout(60)


def line_of(text: str) -> int:
    """The line number of the first worker line holding ``text``."""
    lines = Path(WORKER).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def default_scope_of(text: str) -> str:
    """The default scope (``file:line``) of the worker line holding ``text``."""
    return f"{WORKER}:{line_of(text)}"


def in_stack(text: str) -> str:
    """How faulthandler names the worker line holding ``text``."""
    return f'wd_worker.py", line {line_of(text)} in'


@pytest.mark.parametrize(
    ("mode", "scope", "stack_line"),
    [
        pytest.param("sleep", "sleep-hang", "# hang:sleep", id="sleep"),
        pytest.param("gil", "gil-hang", "sum(range(10**14))", id="busy-loop-holding-gil-in-C"),
        pytest.param("torch_api", None, "# hang:torch_api", id="configure-expires-default-scope"),
        pytest.param("nested", "step", "# hang:nested", id="nested-same-scope"),
    ],
)
def test_hung_worker_is_dumped_then_killed(
    make_server: Callable[..., WatchdogServer],
    workers: Workers,
    events_file: Path,
    mode: str,
    scope: str | None,
    stack_line: str,
) -> None:
    watched_at_expiry: list[list[int]] = []
    server = make_server(on_expire=lambda ev: watched_at_expiry.append(server.worker_pids()))
    proc = workers.spawn(server.env(), mode, "0.5")
    ready = read_json_line(proc, 30)
    assert ready["registered"] is True
    rc = proc.wait(20)
    assert rc in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["outcome"] == "killed"
    assert ev["scope"] == (scope or default_scope_of("with expires(after=after):"))
    assert ev["after_s"] == pytest.approx(0.5, abs=1e-3)
    assert ev["thread"] == ready["thread"]
    assert ev["signals"][1:] == ["SIGCONT", "SIGTERM", "SIGKILL"]
    assert 0 <= ev["dead_after_s"] < 2.0  # generous: 2 shared cores; the benchmark measures the real figure
    assert in_stack(stack_line) in ev["stack"]
    assert in_stack(stack_line) in Path(ev["stack_file"]).read_text()
    assert server.running
    # Not watched any more once its expiry is heard of: the callback runs as the event is written, before the
    # server loop forgets the worker (a check after reading the events file raced that loop: issue 34's stress round).
    assert watched_at_expiry == [[]]
    assert proc.pid not in server.worker_pids()


@pytest.mark.timeout(60)
def test_threads_on_one_line_are_independent(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    proc = workers.spawn(server.env(), "threads", "2.0")
    ready = read_json_line(proc, 30)  # printed after 3 fast threads armed/disarmed 6000 times on that line
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["thread"] == ready["thread"]
    assert ev["after_s"] == pytest.approx(2.0, abs=1e-3)


def test_sigstopped_worker_is_continued_dumped_and_killed(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server(grace=0.5)
    proc = workers.spawn(server.env(), "sigstop", "0.5")
    read_json_line(proc, 30)
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["outcome"] == "killed"
    assert "SIGCONT" in ev["signals"]
    assert in_stack("# stops here") in ev["stack"]  # dumped once SIGCONT let it run


def test_sigterm_ignoring_worker_gets_sigkill_after_grace(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server(grace=0.6)
    proc = workers.spawn(server.env(), "ignore_term", "0.4")
    read_json_line(proc, 30)
    assert proc.wait(20) == -signal.SIGKILL
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["signals"][-2:] == ["SIGTERM", "SIGKILL"]
    assert ev["outcome"] == "killed"
    assert ev["dead_after_s"] >= 0.6


def test_sigterm_is_enough_for_a_well_behaved_worker(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server(grace=5.0)
    proc = workers.spawn(server.env(), "sleep", "0.4")
    read_json_line(proc, 30)
    assert proc.wait(20) == -signal.SIGTERM
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["signals"][-1] == "SIGTERM"
    assert ev["dead_after_s"] < 2.0


def test_heartbeat_kills_a_worker_that_stops_beating(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    proc = workers.spawn(server.env(), "heartbeat", "0.5")
    read_json_line(proc, 30)
    read_json_line(proc, 30)  # alive through 10 beats (2 timeouts): not killed while beating
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["scope"] == "heartbeat"


def test_worker_exiting_while_armed_is_forgotten_not_killed(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    proc = workers.spawn(server.env(), "exit_armed")
    read_json_line(proc, 30)
    assert proc.pid in server.worker_pids()
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(20) == 0
    note = wait_for(
        lambda: next((e for e in read_events(events_file) if e["event"] == "watchdog.exited_armed"), None),
        5,
        "the exited_armed note",
    )
    assert note["pid"] == proc.pid
    assert note["scope"] == "exits"
    wait_for(lambda: proc.pid not in server.worker_pids(), 5, "the server to forget the worker")
    assert server.running
    assert not [e for e in read_events(events_file) if e["event"] == "watchdog.expired"]


def test_finished_regions_are_never_killed(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path
) -> None:
    server = make_server()
    proc = workers.spawn(server.env(), "completes", "0.3")
    assert read_json_line(proc, 30)["registered"] is True
    with pytest.raises(AssertionError, match="exited"):
        read_json_line(proc, 30)  # the guarded sleep (3 x the timeout) is killed, so "completed" never comes
    assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
    ev = wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
    assert ev["scope"] == "guarded"  # never one of the 100 "quick" regions that finished in time


def test_server_never_registers_its_own_process(make_server: Callable[..., WatchdogServer]) -> None:
    from distinit.watchdog import WatchdogClient

    server = make_server()
    client = WatchdogClient(server.path)
    try:
        assert not client.registered
        assert "own process" in client.reason
        with client.expires(0.05, scope="self"):
            pass
    finally:
        client.close()
    assert server.worker_pids() == []


@pytest.mark.parametrize("kill_group", [pytest.param(True, id="kill-group"), pytest.param(False, id="worker-only")])
def test_kill_group_takes_the_workers_children_along(
    make_server: Callable[..., WatchdogServer], workers: Workers, events_file: Path, kill_group: bool
) -> None:

    server = make_server(kill_group=kill_group)
    proc = workers.spawn(server.env(), "group", "0.4", start_new_session=True)  # as torchrun starts workers
    child = Pinned(read_json_line(proc, 30)["child"])
    try:
        assert proc.wait(20) in (-signal.SIGTERM, -signal.SIGKILL)
        wait_for(expired_for(events_file, proc.pid), 5, "the expired event")
        if kill_group:
            wait_for(lambda: not child.alive(), 20, "the worker's child to die with its group")
        else:
            assert child.alive()  # only the worker itself was signalled
    finally:
        child.signal(signal.SIGKILL)
        child.close()


# A worker leading its own group, with a child that dies on SIGTERM (``sleep``) or ignores it (it needs the
# group's SIGKILL). Prints the child's pid once the child is ready.
_LEADER = """
import subprocess, sys, time
ignores = sys.argv[1] == "ignores"
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", code] if ignores else ["sleep", "600"], stdout=subprocess.PIPE)
if ignores:
    child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("child_kind", ["dies-on-sigterm", "ignores"])
def test_kill_group_reaches_the_group_after_the_worker_was_reaped(tmp_path: Path, child_kind: str) -> None:
    # The flake of issue 34, made certain: the worker dies of the ladder's SIGTERM and its launcher reaps it
    # before the server thread (preempted, on a loaded host) goes on. The group must be signalled all the same.
    import subprocess
    import sys
    import threading

    from distinit.watchdog._ladder import LadderConfig, run_ladder
    from distinit.watchdog._proc import PIDFD_SIGNAL_PROCESS_GROUP, ProcessRef

    reaped = threading.Event()

    class PreemptedAfterSigterm(ProcessRef):
        """The worker's handle; the server thread stalls after signalling the worker until it was reaped."""

        def send(self, sig: int) -> bool:
            sent = super().send(sig)
            if sig == signal.SIGTERM:
                assert reaped.wait(20), "the worker was not reaped after SIGTERM"
            return sent

    leader = subprocess.Popen(
        [sys.executable, "-c", _LEADER, child_kind], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child: Pinned | None = None
    try:
        assert leader.stdout is not None
        child = Pinned(int(leader.stdout.readline()))
        ref = PreemptedAfterSigterm.open(leader.pid)
        assert ref is not None and ref.leads_group and ref.pidfd is not None
        if child_kind == "ignores":
            try:  # signal 0: permission check only
                signal.pidfd_send_signal(ref.pidfd, 0, None, PIDFD_SIGNAL_PROCESS_GROUP)
            except OSError:
                pytest.skip("a kernel before 6.9 names a reaped worker's group by number only: not signalled")
        threading.Thread(target=lambda: (leader.wait(), reaped.set()), daemon=True).start()  # its launcher
        result = run_ladder(ref, 0, None, LadderConfig(grace=0.0, dump_stacks=False, kill_group=True))
        ref.close()
        assert leader.returncode == -signal.SIGTERM
        assert result.outcome == "killed"
        pinned = child
        wait_for(lambda: not pinned.alive(), 20, "the worker's child to die with its group")
        assert "SIGKILL" in result.signals  # sent to the group, the worker being gone already
    finally:
        if child is not None:
            child.signal(signal.SIGKILL)
            child.close()
        leader.kill()  # a Popen: nothing is sent once it was reaped
        leader.wait(10)
        if leader.stdout is not None:
            leader.stdout.close()
