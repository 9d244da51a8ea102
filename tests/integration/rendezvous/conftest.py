"""Fixtures for the torchrun rendezvous tests (the init tests' port helper and namespaces are reused)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "init"))  # init_launch: NetNs, free_port

from init_launch import free_port
from rdzv_agents import Agents


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    handle = Agents(tmp_path)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def port() -> int:
    return free_port()
