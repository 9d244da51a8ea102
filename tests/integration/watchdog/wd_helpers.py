"""Helpers for the watchdog integration tests (a unique module name: several test folders have a conftest)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKER = str(Path(__file__).with_name("wd_worker.py"))


def read_json_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The next JSON line the worker prints, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"worker {proc.pid} printed nothing within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"worker {proc.pid} exited (rc {proc.poll()}) before printing")
    result: dict[str, Any] = json.loads(line)
    return result


def torchrun_path() -> str | None:
    """The ``torchrun`` beside this interpreter (or on PATH), None when it is not installed."""
    import shutil

    found = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    return found if os.access(found, os.X_OK) else None


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` every 10 ms until truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def expired_for(events: Path, pid: int) -> Callable[[], dict[str, Any] | None]:
    def find() -> dict[str, Any] | None:
        return next((e for e in read_events(events) if e["event"] == "watchdog.expired" and e["pid"] == pid), None)

    return find


class Pinned:
    """A process the test knows only by number (a grandchild, a daemon behind a shell), pinned by a pidfd at once.

    The number is freed when the process's parent reaps it, and then names whatever process gets it next, anywhere
    on the machine: a clean-up's ``os.kill(pid)`` after the process died kills a stranger (another test's
    daemon). Pinned while the test knows the number is that process, it is signalled through the pidfd, which
    reaches that process or, once it has exited, nothing.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = os.pidfd_open(pid)  # ProcessLookupError: already gone when the test learned it

    def alive(self) -> bool:
        """Whether the process has not exited (the pidfd turns readable when it does)."""
        if self._fd is None:
            return False
        return not select.select([self._fd], [], [], 0)[0]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to this process; nothing when it has exited, whoever holds its number now."""
        if self._fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, sig)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Workers:
    """Starts worker processes and kills, by pid, any still running at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, env: dict[str, str], *args: str, **popen: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, WORKER, *args],
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            **popen,
        )
        self.procs.append(proc)
        return proc

    def track(self, proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, 9)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


def start_daemon(workers: Workers, wd_dir: Path, events: Path, *extra: str) -> subprocess.Popen[str]:
    proc = workers.track(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distinit.cli",
                "watchdog",
                "serve",
                "--path",
                str(wd_dir),
                "--grace",
                "0",
                "--events",
                str(events),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    wait_for(
        lambda: (
            any(e["event"] == "watchdog.started" and e["server_pid"] == proc.pid for e in read_events(events))
            or proc.poll() is not None
        ),
        30,
        "the daemon to start",
    )
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    return proc
