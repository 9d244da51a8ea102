"""Sum up where the test suite's CPU goes, from the per-test lines ``DISTINIT_TEST_CPU=DIR`` records.

``tests/conftest.py`` writes one JSON line per test (``{"test", "wall", "self", "children", "forked"}``, seconds)
to ``DIR/cpu-<worker>.jsonl`` when the variable is set. This script reads every such file and reports the totals,
the CPU of each test directory (``tests/integration/init``, ...), and the tests that cost the most CPU, so that
the suite's time (issue 34: CPU-bound on 2 cores) is cut where it is spent, not where it is guessed.

Usage: ``DISTINIT_TEST_CPU=/tmp/cpu make test``, then ``python scripts/suite_cpu.py /tmp/cpu [--top 30]
[--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def cpu_of(line: dict[str, Any]) -> float:
    """One test's CPU seconds: its pytest process, its reaped processes, and its forked ranks."""
    return float(line["self"]) + float(line["children"]) + float(line["forked"])


def group_of(test: str, depth: int = 3) -> str:
    """``tests/integration/init/test_x.py::t`` -> ``tests/integration/init`` (the file when it is shallower)."""
    parts = test.split("::", 1)[0].split("/")
    return "/".join(parts[:depth]) if len(parts) > depth else "/".join(parts)


def summarize(lines: Iterable[dict[str, Any]], top: int = 30) -> dict[str, Any]:
    """Totals, CPU per test directory (most first), and the ``top`` tests by CPU (each with its wall)."""
    rows = list(lines)
    groups: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu": 0.0, "wall": 0.0, "tests": 0})
    for row in rows:
        group = groups[group_of(row["test"])]
        group["cpu"] += cpu_of(row)
        group["wall"] += float(row["wall"])
        group["tests"] += 1
    ranked = sorted(rows, key=cpu_of, reverse=True)[:top]
    return {
        "tests": len(rows),
        "cpu_s": round(sum(cpu_of(r) for r in rows), 1),
        "wall_s": round(sum(float(r["wall"]) for r in rows), 1),
        "by_part": {
            "pytest": round(sum(float(r["self"]) for r in rows), 1),
            "children": round(sum(float(r["children"]) for r in rows), 1),
            "forked": round(sum(float(r["forked"]) for r in rows), 1),
        },
        "groups": {
            name: {k: round(v, 1) for k, v in g.items()}
            for name, g in sorted(groups.items(), key=lambda kv: kv[1]["cpu"], reverse=True)
        },
        "top": [{"test": r["test"], "cpu": round(cpu_of(r), 2), "wall": r["wall"]} for r in ranked],
    }


def read(where: Path) -> list[dict[str, Any]]:
    """Every line of every ``cpu-*.jsonl`` in ``where``."""
    return [json.loads(text) for path in sorted(where.glob("cpu-*.jsonl")) for text in path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    """Print the summary of a ``DISTINIT_TEST_CPU`` directory (and write it as JSON with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="the DISTINIT_TEST_CPU directory")
    parser.add_argument("--top", type=int, default=30, help="how many of the costliest tests to list")
    parser.add_argument("--out", type=Path, help="also write the summary as JSON here")
    args = parser.parse_args(argv)
    summary = summarize(read(args.dir), args.top)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    total = f"{summary['tests']} tests: {summary['cpu_s']} CPU-s, {summary['wall_s']} s of test wall time"
    print(f"{total}; {summary['by_part']}")
    print("\nCPU-s   wall-s  tests  directory")
    for name, g in summary["groups"].items():
        print(f"{g['cpu']:7.1f} {g['wall']:7.1f} {int(g['tests']):6d}  {name}")
    print("\nCPU-s   wall-s  test")
    for row in summary["top"]:
        print(f"{row['cpu']:7.2f} {row['wall']:7.2f}  {row['test']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
