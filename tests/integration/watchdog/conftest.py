"""Fixtures for the watchdog integration tests: real servers, real worker processes, bounded waits."""

from __future__ import annotations

import sys
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
