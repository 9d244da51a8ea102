"""Fixtures for the init fault tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from init_launch import Launcher, free_port
from tests._scripts import load_script


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    handle = Launcher(tmp_path)
    try:
        yield handle
    finally:
        handle.stop_all()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def burners() -> Iterator[list[int]]:
    """Two busy loops per core beside the test (scripts/burners.py: started and stopped by pid, in this session)."""
    with load_script("burners").burning(2) as pids:
        yield pids
