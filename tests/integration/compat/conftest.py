"""Fixtures for the compat smoke test: the helpers of the init, doctor, rendezvous and watchdog tests, reused.

``make test-compat`` (scripts/compat.py) runs this folder in a venv per torch version; the full suite runs it
on the pinned torch. Each helper folder is put on the path, as the other folders' conftests do for ``init``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "init"))  # init_launch: Launcher, free_port
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor"))  # doctor_launch: DOCTOR, clean_environ
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rendezvous"))  # rdzv_agents: Agents
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "watchdog"))  # wd_helpers: Workers

from init_launch import Launcher, free_port
from rdzv_agents import Agents
from wd_helpers import Workers


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    handle = Launcher(tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    handle = Agents(tmp_path)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def workers() -> Iterator[Workers]:
    handle = Workers()
    try:
        yield handle
    finally:
        handle.cleanup()


@pytest.fixture
def port() -> int:
    return free_port()
