"""scripts/suite_times.py reads a CI log: pytest's final line, the slowest durations and wall-clock stamps."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests._scripts import load_script


@pytest.fixture(scope="module")
def suite_times() -> ModuleType:
    return load_script("suite_times")


def _durations(n: int) -> list[str]:
    """``n`` duration lines, slowest first, as ``--durations`` prints them."""
    return [f"{60 - i}.{i:02d}s call     tests/integration/test_x.py::test_{i}[case-{i}]" for i in range(n)]


LOG = "\n".join(
    [
        "=== 2026-11-27T02:00:00Z make test",
        ".venv/bin/python -m pip install -q -e '.[test,dev]'",
        "2026-11-27 02:03:00,123 WARNING distinit.init rank 1: a captured log line, not a stamp",
        "=== 2026-11-27T02:02:30+00:00 pytest",
        "4 workers [1808 items]",
        "........s.....F....",
        "============================= slowest 25 durations =============================",
        *_durations(22),
        "(3 durations < 0.005s hidden.  Use -vv to show these durations.)",
        "=========================== short test summary info ============================",
        "FAILED tests/integration/test_y.py::test_z - AssertionError",
        "1 failed, 1797 passed, 10 skipped, 1 warning, 2 errors in 1295.65s (0:21:35)",
        "rc=2",
        "Fri Nov 27 02:24:40 UTC 2026",
    ]
)


def test_the_final_line_gives_seconds_and_every_count(suite_times: ModuleType) -> None:
    data = suite_times.parse(LOG)
    assert data["pytest_s"] == pytest.approx(1295.65)
    assert data["pytest_clock"] == "0:21:35"
    assert data["counts"] == {"failed": 1, "passed": 1797, "skipped": 10, "warnings": 1, "errors": 2}
    assert data["rc"] == 2


def test_the_twenty_slowest_are_kept_slowest_first(suite_times: ModuleType) -> None:
    data = suite_times.parse(LOG)
    assert data["slowest_listed"] == 22
    assert len(data["slowest"]) == 20
    assert data["slowest"][0] == {
        "seconds": 60.0,
        "phase": "call",
        "test": "tests/integration/test_x.py::test_0[case-0]",
    }
    seconds = [row["seconds"] for row in data["slowest"]]
    assert seconds == sorted(seconds, reverse=True)


def test_stamps_give_the_wall_clock_and_its_phases(suite_times: ModuleType) -> None:
    data = suite_times.parse(LOG)
    assert [s["label"] for s in data["stamps"]] == ["make test", "pytest", ""]  # the logging line is not one
    assert data["wall_s"] == pytest.approx(24 * 60 + 40)
    assert [(p["from"], p["seconds"]) for p in data["phases"]] == [("make test", 150.0), ("pytest", 1330.0)]


@pytest.mark.parametrize(
    ("line", "seconds", "counts"),
    [
        pytest.param("==== 12 passed in 3.40s ====", 3.4, {"passed": 12}, id="decorated"),
        pytest.param(
            "5 passed, 1 xfailed, 1 deselected in 0.51s",
            0.51,
            {"passed": 5, "xfailed": 1},  # deselected: run by the other pass of `make test`, never counted
            id="quiet-no-clock",
        ),
    ],
)
def test_final_line_shapes(suite_times: ModuleType, line: str, seconds: float, counts: dict[str, int]) -> None:
    data = suite_times.parse(f"collected\n{line}\n")
    assert data["pytest_s"] == pytest.approx(seconds)
    assert data["counts"] == counts
    assert data["wall_s"] is None and data["slowest"] == []


def test_the_two_passes_of_make_test_add_up(suite_times: ModuleType) -> None:
    log = (
        "============ slowest 2 durations ============\n30.30s setup    tests/a.py::t\n2.00s call     tests/b.py::u\n"
        "1861 passed, 13 skipped, 1 warning in 861.02s (0:14:21)\n"
        "============ slowest 1 durations ============\n40.00s call     tests/c.py::v\n"
        "5 passed, 1874 deselected in 51.59s\n"
    )
    data = suite_times.parse(log)
    assert data["passes"] == 2 and data["pytest_s"] == pytest.approx(912.61) and data["pytest_clock"] is None
    assert data["counts"] == {"passed": 1866, "skipped": 13, "warnings": 1}
    assert [row["seconds"] for row in data["slowest"]] == [40.0, 30.3, 2.0]


def test_the_command_writes_json_and_fails_without_a_pytest_line(suite_times: ModuleType, tmp_path: Path) -> None:
    log, out = tmp_path / "ci.log", tmp_path / "results" / "suite.json"
    log.write_text(LOG)
    assert suite_times.main([str(log), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["pytest_s"] == pytest.approx(1295.65)
    assert written["meta"]["log"] == str(log)
    log.write_text("make: *** [Makefile:72: lint] Error 1\n")
    assert suite_times.main([str(log), "--out", str(out)]) == 1
