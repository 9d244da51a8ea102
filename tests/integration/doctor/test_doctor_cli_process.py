"""The ``doctor`` command line run as ``python -m distinit.doctor`` in a fresh process: its exit status and report.

Starts a real interpreter; the pure option and output tests are in ``tests/unit/doctor/test_doctor_cli.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(60)
def test_an_incomplete_environment_is_exit_two() -> None:
    environ = {"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore", "RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "distinit.doctor", "--json", "--timeout", "20"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    report = json.loads(done.stdout)
    env = report["checks"][0]
    assert env["id"] == "env" and env["status"] == "fail" and "IncompleteEnvError" in env["summary"]
    assert "WORLD_SIZE" in env["fix"]
