"""Fixtures for the init fault tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from init_launch import Launcher, free_port


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


#: A busy loop that ends by itself once its parent (this pytest worker) is gone, even after a SIGKILL.
BURN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(100_000): pass"


@pytest.fixture
def burners() -> Iterator[list[int]]:
    """Two busy loops per core beside the test (started and stopped by pid): a loaded machine, on purpose."""
    count = 2 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
