"""Every benchmark and project script starts: ``--help`` answers with exit 0, as a user runs it from anywhere.

The benchmarks reuse the tests' harnesses (``init_launch``, the culprit test), which import ``tests._zygote``;
once that import came in, two benchmarks died at start with ``No module named 'tests'`` and nothing noticed. Run
from a temporary directory, so that only the script's own ``sys.path`` set-up can find what it imports.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests._zygote import popen

ROOT = Path(__file__).resolve().parents[2]
#: The scripts with a command line (argparse); plot.py and run_all.py run at once, and the install helpers act.
SCRIPTS = sorted(p for p in [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")] if "argparse" in p.read_text())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{p.parent.name}/{p.name}" for p in SCRIPTS])
def test_help_answers(script: Path, tmp_path: Path) -> None:
    proc = popen(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-3000:]
    assert "usage:" in out, out[-2000:]


def test_the_scripts_are_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"bench_torchrun.py", "bench_after_setup.py", "flakes.py", "compat.py"} <= names, names
