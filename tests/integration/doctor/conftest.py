"""Fixtures for the doctor's integration tests (the init tests' namespace helpers are reused)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "init"))  # init_launch: NetNs, free_port

from doctor_launch import Ranks
from init_launch import free_port


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Ranks]:
    handle = Ranks(tmp_path)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def port() -> int:
    return free_port()
