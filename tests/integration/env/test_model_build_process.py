"""What ``import distinit.env`` does in a fresh interpreter (a child process): ``DistEnv``'s schema is complete right
after the import (built once, at import: issue 27's import cost), and neither torch nor tenacity is imported.

What is imported is asserted here, never how long it takes: timings live in ``benchmarks/bench_import.py``. The
public module in reprs and pickles is checked in ``tests/unit/env/test_model_build.py``.
"""

from __future__ import annotations

import subprocess
import sys


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_schema_is_complete_right_after_import() -> None:
    # A fresh interpreter: in this one an earlier validation may already have rebuilt the schema. An
    # incomplete schema at import means every model naming DistEnv rebuilds it, and so does its first use.
    done = _fresh("import sys; from distinit.env import DistEnv; sys.exit(0 if DistEnv.__pydantic_complete__ else 3)")
    assert done.returncode == 0, done.stderr


def test_env_imports_neither_torch_nor_tenacity() -> None:
    code = "import sys, distinit.env; print(sorted({'torch', 'tenacity'} & set(sys.modules)))"
    done = _fresh(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
