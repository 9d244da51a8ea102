"""scripts/flakes.py end to end: one real round beside burners names the failing test with its failure text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "flakes.py"


@pytest.mark.timeout(120)
def test_a_real_round_reports_the_failing_test_with_its_text(tmp_path: Path) -> None:
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_sample.py").write_text("def test_pass():\n    pass\n\n\ndef test_fail():\n    assert 1 == 2\n")
    out = tmp_path / "flakes.json"
    args = ["--rounds", "1", "--per-core", "0", "--workers", "0", "--out", str(out), str(tests)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert [entry["test"].rsplit("::", 1)[-1] for entry in report["flaky"]] == ["test_fail"]
    assert "assert 1 == 2" in report["flaky"][0]["failures"][0]
    assert report["runs"][0]["counts"] == {"passed": 1, "failed": 1}
    assert "FLAKY" in done.stdout and "test_fail" in done.stdout
