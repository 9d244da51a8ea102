"""torch's FileTimer test cases, run against ``distinit.watchdog.elastic`` with the module name swapped.

Origin: the 15 cases of ``test/distributed/elastic/timer/file_based_local_timer_test.py`` in pytorch/pytorch
(BSD-3-Clause, Copyright (c) Meta Platforms, Inc. and affiliates), one test here per case, with the same name,
the same calls and the same assertions, written for pytest (tmp_path FIFOs, pytest-timeout, bounded joins).
The client and server are used exactly as torch's tests use them: ``timer.FileTimerServer(path, "test",
0.01)``, ``timer.FileTimerClient(path)``, ``timer.expires(...)``, ``server._timers``,
``server._request_count``, ``client._send_request(...)``, and ``mock.patch`` of
``FileTimerServer._reap_worker`` and ``FileTimerServer.is_process_running``.

One case tests a torch defect and is replaced by a test of the fixed behaviour (its comment names the torch
behaviour): ``test_expired_timers``. Two more, ``test_timer`` and ``test_get_timer_recursive``, SIGKILL the
pytest process under torch 2.13 (its server signals itself after a reap); they run here unchanged, which is
the test that distinit's server does not. Two torch cases assert nothing and pass unless the process dies,
``test_happy_path`` and ``test_watchdog_empty_queue``: here they assert what they port (their comments say what).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
import unittest.mock as mock
from collections.abc import Iterator
from pathlib import Path

import pytest

import distinit.watchdog.elastic as timer

pytestmark = pytest.mark.timeout(60)

MAX_INTERVAL = 0.01
# Worker processes are forked, as torch's tests do (their targets are local functions).
FORK = mp.get_context("fork")


def _join(proc: mp.process.BaseProcess, timeout: float = 30) -> int | None:
    proc.join(timeout)
    if proc.exitcode is None:  # never leave a worker behind: stop it, by pid, and fail
        proc.kill()
        proc.join(10)
        pytest.fail(f"worker pid {proc.pid} still ran after {timeout} s")
    return proc.exitcode


@pytest.fixture(autouse=True)
def _no_configured_client() -> Iterator[None]:
    yield
    timer.configure(None)


@pytest.fixture
def file_path(tmp_path: Path) -> str:
    return str(tmp_path / "timer_fifo")


@pytest.fixture
def server(file_path: str) -> Iterator[timer.FileTimerServer]:
    """FileTimerTest's setUp/tearDown: a started server."""
    srv = timer.FileTimerServer(file_path, "test", MAX_INTERVAL)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def idle_server(file_path: str) -> Iterator[timer.FileTimerServer]:
    """FileTimerServerTest's setUp/tearDown: a server each test starts itself."""
    srv = timer.FileTimerServer(file_path, "test", MAX_INTERVAL)
    yield srv
    srv.stop()


# -- FileTimerTest ------------------------------------------------------------------------------------------


def _nest(n: int, file_path: str | None, after: float = 100, pause: float = 0.01) -> None:
    """``n`` nested default-scope regions of ``after`` s, each sleeping ``pause`` s after the inner one."""
    if file_path is not None:
        timer.configure(timer.FileTimerClient(file_path))
    if n > 0:
        with timer.expires(after=after):
            _nest(n - 1, None, after, pause)
            time.sleep(pause)


def func2(n: int, file_path: str | None) -> None:
    """Times out: the innermost region (0.1 s) sleeps 0.2 s."""
    _nest(n, file_path, 0.1, 0.2)


def test_exception_propagation(server: timer.FileTimerServer) -> None:
    timer.configure(timer.FileTimerClient(server._file_path))
    with pytest.raises(RuntimeError, match="foobar"), timer.expires(after=1):
        raise RuntimeError("foobar")


def test_no_client(server: timer.FileTimerServer) -> None:
    timer.configure(None)
    with pytest.raises(RuntimeError, match="Configure timer client"), timer.expires(after=1):
        pass


def test_client_interaction(server: timer.FileTimerServer, file_path: str) -> None:
    client = timer.FileTimerClient(file_path)
    client.acquire = mock.MagicMock(wraps=client.acquire)  # type: ignore[method-assign]
    client.release = mock.MagicMock(wraps=client.release)  # type: ignore[method-assign]
    with timer.expires(after=1, scope="test", client=client):
        pass
    client.acquire.assert_called_once_with("test", mock.ANY)
    client.release.assert_called_once_with("test")


@mock.patch("distinit.watchdog.elastic.FileTimerServer._reap_worker")
def test_happy_path(mock_reap: mock.MagicMock, server: timer.FileTimerServer, file_path: str) -> None:
    # torch's case passes unless the process dies; what it ports is checked here: a region that ends in time
    # reaches the server as one acquire and one release, leaves no timer, and nobody is reaped. torch's
    # region is after=0.5 around a 0.1 s sleep; on 2 shared cores the sleep may overrun 0.5 s, so the bound
    # here is 30 s (the server reads the FIFO however long the region lasted).
    timer.configure(timer.FileTimerClient(file_path))
    with timer.expires(after=30):
        time.sleep(0.1)
    server.run_once()  # reads every request already written, then stops the thread
    assert server._request_count == 2
    assert server._timers == {}
    mock_reap.assert_not_called()


def test_get_timer_recursive(server: timer.FileTimerServer, file_path: str) -> None:
    # Recursion with the default scope re-acquires one timer: only the innermost call's deadline counts.
    # Under torch 2.13 this test SIGKILLs the test process (the server reaps func2's worker, then itself).
    timer.configure(timer.FileTimerClient(file_path))

    def func(n: int) -> None:
        if n > 0:
            with timer.expires(after=0.1):
                func(n - 1)
                time.sleep(0.05)

    func(4)  # in this very process: the server's own process, never signalled anyway
    proc = FORK.Process(target=func2, args=(2, file_path))
    proc.start()
    assert _join(proc) == -signal.SIGKILL


def test_multiple_clients_interaction(server: timer.FileTimerServer, file_path: str) -> None:
    procs = [FORK.Process(target=_nest, args=(10, file_path)) for _ in range(10)]
    for proc in procs:
        proc.start()
    assert [_join(proc) for proc in procs] == [0] * 10
    server.run_once()  # reads every request already written
    assert server._request_count == 2 * 10 * 10


def _acquire_and_exit(file_path: str) -> None:
    client = timer.FileTimerClient(file_path)
    timer.configure(client)
    client.acquire("test_scope", time.time() + 2)
    time.sleep(1)


@mock.patch("distinit.watchdog.elastic.FileTimerServer._reap_worker")
def test_exit_before_release(mock_reap: mock.MagicMock, server: timer.FileTimerServer, file_path: str) -> None:
    proc = FORK.Process(target=_acquire_and_exit, args=(file_path,))
    proc.start()
    assert _join(proc) == 0
    time.sleep(2)  # past the deadline the exited worker left behind
    server.run_once()
    mock_reap.assert_not_called()
    assert len(server._timers) == 0


@mock.patch("distinit.watchdog.elastic.FileTimerServer._reap_worker")
@mock.patch("distinit.watchdog.elastic.FileTimerServer.is_process_running")
def test_exit_before_release_reap(
    mock_pid_exists: mock.MagicMock, mock_reap: mock.MagicMock, server: timer.FileTimerServer, file_path: str
) -> None:
    mock_pid_exists.return_value = True
    proc = FORK.Process(target=_acquire_and_exit, args=(file_path,))
    proc.start()
    assert _join(proc) == 0
    time.sleep(2)
    server.run_once()
    mock_reap.assert_called()
    assert len(server._timers) == 0


def _run(file_path: str, timeout: float, duration: float) -> None:
    timer.configure(timer.FileTimerClient(file_path))
    with timer.expires(after=timeout):
        time.sleep(duration)


def test_timer(server: timer.FileTimerServer, file_path: str) -> None:
    # The worker dies of the requested signal (SIGKILL by default: exit status -9). Under torch 2.13 this
    # test SIGKILLs the test process too (the server signals its own pid after the reap).
    proc = FORK.Process(target=_run, args=(file_path, 0.1, 1))
    proc.start()
    assert _join(proc) == -signal.SIGKILL


# -- FileTimerClientTest ------------------------------------------------------------------------------------


def test_send_request_without_server(tmp_path: Path) -> None:
    timer.configure(timer.FileTimerClient(str(tmp_path / "test_file")))
    with pytest.raises(BrokenPipeError), timer.expires(after=0.1):
        time.sleep(0.1)


# -- FileTimerServerTest ------------------------------------------------------------------------------------


def _expired_timer(pid: int, scope: str) -> timer.FileTimerRequest:
    return timer.FileTimerRequest(
        worker_pid=pid, scope_id=scope, expiration_time=time.time() - 60, signal=signal.SIGKILL
    )


def _valid_timer(pid: int, scope: str) -> timer.FileTimerRequest:
    return timer.FileTimerRequest(
        worker_pid=pid, scope_id=scope, expiration_time=time.time() + 60, signal=signal.SIGKILL
    )


def _release_timer(pid: int, scope: str) -> timer.FileTimerRequest:
    return timer.FileTimerRequest(worker_pid=pid, scope_id=scope, expiration_time=-1)


def test_watchdog_call_count(idle_server: timer.FileTimerServer, file_path: str) -> None:
    # One _run_watchdog call per max_interval, +- 1. Interval ends follow a fixed schedule, so the count
    # holds on a loaded machine too (torch's drifts with every late wake-up).
    # The upper bound counts the time that really passed: on a loaded 2-core machine time.sleep(0.1) and
    # stop() can take 0.13 s, and a 13th call in 0.13 s is on schedule (torch's assertion of 11 then fails).
    idle_server._run_watchdog = mock.MagicMock(wraps=idle_server._run_watchdog)  # type: ignore[method-assign]
    started = time.monotonic()
    idle_server.start()
    timer.FileTimerClient(file_path)._send_request(_valid_timer(pid=-3, scope="test0"))
    wait = 0.1
    time.sleep(wait)
    idle_server.stop()
    elapsed = time.monotonic() - started
    calls = idle_server._run_watchdog.call_count
    assert int(wait / MAX_INTERVAL) - 1 <= calls <= int(max(wait, elapsed) / MAX_INTERVAL) + 1


def test_watchdog_empty_queue(idle_server: timer.FileTimerServer, caplog: pytest.LogCaptureFixture) -> None:
    # torch's case: "checks that the watchdog can run on an empty pipe", by starting it and passing unless
    # the process dies. Checked here: the loop runs on the empty FIFO, finishes one more pass when asked
    # and ends, reads nothing, holds no timer, and neither its loop nor a callback logged a failure.
    events: list[str] = []
    idle_server._log_event = lambda name, request: events.append(name)
    idle_server.start()
    thread = idle_server._watchdog_thread
    assert thread is not None and thread.is_alive()
    idle_server.run_once()
    assert not thread.is_alive()
    assert idle_server._is_client_started  # the loop itself ran, not only run_once's fallback pass
    assert idle_server._request_count == 0
    assert idle_server._timers == {}
    assert events == ["watchdog started"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@mock.patch("os.kill")
def test_expired_timers(mock_os_kill: mock.MagicMock, idle_server: timer.FileTimerServer, file_path: str) -> None:
    # Replaced. torch's test expects os.kill(-3, SIGKILL): torch signals a self-reported pid as it is, and
    # kill(-3) is process group 3; then it signals its own process. Fixed: an expired timer of a pid that
    # is not a live process of this user (here -3, a process group) clears that pid's timers, is reported,
    # and nothing is signalled.
    events: list[tuple[str, timer.FileTimerRequest | None]] = []
    idle_server._log_event = lambda name, request: events.append((name, request))
    idle_server.start()
    client = timer.FileTimerClient(file_path)
    client._send_request(_expired_timer(pid=-3, scope="test1"))
    client._send_request(_valid_timer(pid=-3, scope="test2"))
    idle_server.run_once()
    assert len(idle_server._timers) == 0
    mock_os_kill.assert_not_called()
    expired = [request for name, request in events if name == "timer expired"]
    assert [(r.worker_pid, r.scope_id) for r in expired if r is not None] == [(-3, "test1")]
    assert "kill worker process" not in [name for name, _ in events]


@mock.patch("os.kill")
def test_send_request_release(mock_os_kill: mock.MagicMock, idle_server: timer.FileTimerServer, file_path: str) -> None:
    idle_server.start()
    client = timer.FileTimerClient(file_path)
    client._send_request(_valid_timer(pid=-3, scope="test1"))
    client._send_request(_release_timer(pid=-3, scope="test1"))
    client._send_request(_release_timer(pid=-3, scope="test2"))  # a vacuous release: a no-op
    # torch asserts at once, which races the server thread: distinit's wakes as soon as the first line
    # arrives and may hold the acquire before it reads the release (seen under load). run_once() reads
    # every line written, so the assertion below tests the release rather than the scheduler.
    idle_server.run_once()
    assert len(idle_server._timers) == 0
    mock_os_kill.assert_not_called()


@mock.patch("distinit.watchdog.elastic.FileTimerServer.is_process_running")
@mock.patch("os.kill")
def test_valid_timers(
    mock_os_kill: mock.MagicMock, mock_pid_exists: mock.MagicMock, idle_server: timer.FileTimerServer, file_path: str
) -> None:
    idle_server.start()
    mock_pid_exists.return_value = True
    client = timer.FileTimerClient(file_path)
    for pid in (-3, -2):
        for scope in ("test1", "test2"):
            client._send_request(_valid_timer(pid=pid, scope=scope))
    idle_server.run_once()
    assert len(idle_server._timers) == 4
    assert {(-3, "test1"), (-3, "test2"), (-2, "test1"), (-2, "test2")} == set(idle_server._timers)
    mock_os_kill.assert_not_called()
