"""scripts/suite_cpu.py sums the per-test CPU lines that ``DISTINIT_TEST_CPU`` records."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests._scripts import load_script


@pytest.fixture(scope="module")
def suite_cpu() -> ModuleType:
    return load_script("suite_cpu")


LINES = [
    {"test": "tests/integration/init/test_a.py::t1", "wall": 10.0, "self": 0.5, "children": 3.0, "forked": 6.0},
    {"test": "tests/integration/init/test_b.py::t2[x]", "wall": 2.0, "self": 0.1, "children": 0.0, "forked": 1.0},
    {"test": "tests/unit/test_c.py::t3", "wall": 0.1, "self": 0.05, "children": 0.0, "forked": 0.0},
    {"test": "tests/integration/test_d.py::t4", "wall": 5.0, "self": 0.2, "children": 20.0, "forked": 0.0},
]


def test_totals_groups_and_ranking(suite_cpu: ModuleType) -> None:
    summary = suite_cpu.summarize(LINES, top=2)
    assert summary["tests"] == 4
    assert summary["cpu_s"] == pytest.approx(30.85, abs=0.1)
    assert summary["by_part"] == {"pytest": 0.9, "children": 23.0, "forked": 7.0}
    assert list(summary["groups"]) == ["tests/integration/test_d.py", "tests/integration/init", "tests/unit/test_c.py"]
    assert summary["groups"]["tests/integration/init"] == {"cpu": 10.6, "wall": 12.0, "tests": 2}
    assert [row["test"] for row in summary["top"]] == [
        "tests/integration/test_d.py::t4",
        "tests/integration/init/test_a.py::t1",
    ]


def test_reads_every_worker_file(suite_cpu: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "cpu-gw0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES[:2]))
    (tmp_path / "cpu-gw1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES[2:]))
    (tmp_path / "other.txt").write_text("not a line")
    assert sorted(r["test"] for r in suite_cpu.read(tmp_path)) == sorted(r["test"] for r in LINES)
