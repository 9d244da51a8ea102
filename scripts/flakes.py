"""Find flaky tests: rerun tests N times beside CPU burners and report every test that failed at least once.

A flaky test is a bug report (in the product or in the test), so this script's report names each one with its
failure text, for a root cause to be found; it never retries a test to make it pass.

Each round is one pytest run of the selection (default ``tests/integration``), the way ``make test`` runs it
(``-n 3`` beside two busy loops per core, ``scripts/burners.py``; then the tests marked ``alone`` one after
another with nothing beside them), with a JUnit XML report per pass that this script reads back. The report:

    {"rounds": N, "per_core": 2, "selection": [...], "runs": [{"round": 1, "seconds": ..., "counts": {...}}],
     "flaky": [{"test": "tests/...::name", "failed": 1, "of": N, "failures": ["first lines of the failure"]}],
     "meta": {...}}

Usage: ``python scripts/flakes.py [--rounds N] [--per-core 2] [--workers 3] [--out benchmarks/results/flakes.json]
[PYTEST_SELECTION...]``. Exit status 0 when no test failed in any round, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from burners import burning  # a sibling script, not a package

ROOT = Path(__file__).resolve().parent.parent
#: Lines of each failure's text kept in the report.
FAILURE_LINES = 12


def _testcases(xml_path: Path) -> list[tuple[str, str, str]]:
    """``(node id, outcome, failure text)`` of each test case of a JUnit XML report (passed/failed/skipped)."""
    if not xml_path.exists():
        return []
    cases = []
    for case in ET.parse(xml_path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        file = case.get("file") or f"{module}.py"
        node = f"{file}::{case.get('name', '?')}"
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                text = (child.get("message") or "") + "\n" + (child.text or "")
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        cases.append((node, outcome, text))
    return cases


def _one_round(
    selection: list[str], workdir: Path, number: int, *, workers: int, per_core: int
) -> tuple[float, list[tuple[str, str, str]]]:
    """One run of ``selection`` as ``make test-stress`` runs it; its seconds and every test case's outcome.

    The parallel pass runs beside the burners; the tests marked ``alone`` (their reasons are in tests/conftest.py)
    run after it with nothing beside them, burners included.
    """
    python = str(ROOT / ".venv" / "bin" / "python")
    xdist = ["-n", str(workers), "--maxschedchunk=1"] if workers else ["-p", "no:xdist"]  # as make test (Makefile)
    started = time.monotonic()
    cases: list[tuple[str, str, str]] = []
    for name, args, burners in (("xdist", [*xdist, "-m", "not alone"], per_core), ("alone", ["-m", "alone"], 0)):
        xml_path = workdir / f"round{number}-{name}.xml"
        command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml_path}", *args, *selection]
        with burning(burners):
            subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
        cases += _testcases(xml_path)
    return time.monotonic() - started, cases


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, write the report, and say which tests failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="how many times to run the selection (default 3)")
    parser.add_argument("--per-core", type=int, default=2, help="CPU burners per core (default 2; 0: none)")
    parser.add_argument("--workers", type=int, default=3, help="xdist workers (default 3; 0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "flakes.json")
    parser.add_argument("selection", nargs="*", default=["tests/integration"], help="pytest selection")
    args = parser.parse_args(argv)
    failed: Counter[str] = Counter()
    texts: defaultdict[str, list[str]] = defaultdict(list)
    runs: list[dict[str, Any]] = []
    burners = args.per_core * (os.cpu_count() or 1)
    print(f"flakes: {args.rounds} round(s) of {' '.join(args.selection)} beside {burners} burners", flush=True)
    with tempfile.TemporaryDirectory(prefix="distinit-flakes-") as tmp:
        for number in range(1, args.rounds + 1):
            seconds, cases = _one_round(args.selection, Path(tmp), number, workers=args.workers, per_core=args.per_core)
            counts = Counter(outcome for _, outcome, _ in cases)
            runs.append({"round": number, "seconds": round(seconds, 1), "counts": dict(counts)})
            for node, outcome, text in cases:
                if outcome == "failed":
                    failed[node] += 1
                    texts[node].append("\n".join(text.strip().splitlines()[:FAILURE_LINES]))
            print(f"flakes: round {number}: {dict(counts)} in {seconds:.0f} s", flush=True)
    report = {
        "rounds": args.rounds,
        "per_core": args.per_core,
        "selection": args.selection,
        "runs": runs,
        "flaky": [
            {"test": node, "failed": n, "of": args.rounds, "failures": texts[node]} for node, n in failed.most_common()
        ],
        "meta": {
            "command": "python scripts/flakes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cpus": os.cpu_count(),
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for entry in report["flaky"]:
        print(f"FLAKY {entry['test']}: failed {entry['failed']} of {args.rounds}", flush=True)
    print(f"flakes: {len(failed)} test(s) failed at least once; report in {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
