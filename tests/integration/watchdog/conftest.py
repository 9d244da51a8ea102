"""Fixtures for the watchdog integration tests: real servers, real worker processes, bounded waits."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wd_helpers import Workers

from distinit.watchdog import WatchdogServer

if not sys.platform.startswith("linux"):
    collect_ignore_glob = ["test_*.py"]  # the watchdog is Linux only (pidfd, SO_PEERCRED, procfs)


@pytest.fixture
def workers() -> Iterator[Workers]:
    w = Workers()
    yield w
    w.cleanup()


@pytest.fixture
def wd_dir(tmp_path: Path) -> Path:
    return tmp_path / "wd"


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def make_server(wd_dir: Path, events_file: Path) -> Iterator[Callable[..., WatchdogServer]]:
    servers: list[WatchdogServer] = []

    def make(**kwargs: Any) -> WatchdogServer:
        kwargs.setdefault("grace", 0.0)
        kwargs.setdefault("events", str(events_file))
        server = WatchdogServer(str(wd_dir), **kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


# Attackers run a system interpreter: the project's venv may sit under a directory only root can enter.
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)


class OtherUser:
    """A throw-away user that runs attacker code in a child process."""

    def __init__(self, name: str) -> None:
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, pw.pw_uid, pw.pw_gid

    def run(self, code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``python3 -c code args...`` as this user (stdout/stderr captured, bounded)."""
        assert SYSTEM_PYTHON is not None
        return subprocess.run(
            [SYSTEM_PYTHON, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            user=self.uid,
            group=self.gid,
            extra_groups=[],
        )


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    """A user created for this test with ``useradd`` and deleted after it (root only)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or SYSTEM_PYTHON is None:
        pytest.skip("needs root, useradd and a system python3 to run an attacker as another user")
    name = f"dwd{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, timeout=30)
    try:
        yield OtherUser(name)
    finally:
        subprocess.run(["userdel", name], check=False, timeout=30, capture_output=True)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-writable sticky directory (like /tmp) whose parents every user can traverse."""
    parent = Path(tempfile.mkdtemp(prefix="distinit-wd-test-", dir="/tmp"))
    parent.chmod(0o1777)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)
