"""The examples of docs/testing.md run as written: the script with python, the tests with pytest."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(150)

DOC = Path(__file__).resolve().parents[3] / "docs" / "testing.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_run_distributed_script_runs(tmp_path: Path) -> None:
    script = _python_blocks()[0]
    assert script.startswith("# check_allreduce.py")
    path = tmp_path / "check_allreduce.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_pytest_examples_pass(pytester: pytest.Pytester, plugin_args: list[str]) -> None:
    blocks = _python_blocks()[1:]
    assert len(blocks) == 3
    for index, block in enumerate(blocks):
        pytester.makepyfile(**{f"test_doc_example_{index}": block})
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=3)
