"""The `distinit` command as users run it: real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DISTINIT = [sys.executable, "-m", "distinit.cli"]


@pytest.mark.timeout(60)
def test_env_check_single_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [*DISTINIT, "env", "--check", "--explain"], env=env, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 1, launcher none" in done.stdout
    assert "check: ok" in done.stdout


@pytest.mark.timeout(60)
def test_watchdog_serve_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "wd"
    path.mkdir(mode=0o700)
    server = subprocess.Popen([*DISTINIT, "watchdog", "serve", "--path", str(path)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (path / "sock").exists():
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "watchdog server did not create its socket in 30 s"
            time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    assert not (path / "sock").exists()
    assert "started server" in (server.stderr.read() if server.stderr else "")


@pytest.mark.timeout(60)
def test_watchdog_serve_refuses_an_open_directory(tmp_path: Path) -> None:
    path = tmp_path / "wd"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    done = subprocess.run(
        [*DISTINIT, "watchdog", "serve", "--path", str(path)], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 2
    assert "WatchdogError" in done.stderr and "0700" in done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["--help"], ["doctor", "--help"], ["env", "--help"]], ids=["top", "doctor", "env"])
def test_help_imports_neither_torch_nor_the_checks(argv: list[str]) -> None:
    """``--help`` answers from argparse alone (its speed is measured in benchmarks/bench_doctor.py, not here)."""
    probe = (
        "import sys\n"
        "from distinit.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        "heavy = sorted(m for m in sys.modules if m in ('torch', 'pydantic') or m.startswith('distinit.doctor'))\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: distinit" in done.stdout
    assert done.stdout.splitlines()[-1] == "HEAVY []", done.stdout[-500:]
