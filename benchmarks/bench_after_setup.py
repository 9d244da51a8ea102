"""After setup(): how soon every survivor names the killed rank, and whether it names the right one.

World 4 on two emulated hosts (a UTS namespace per rank: ranks 0, 1 on ``hosta``, 2, 3 on ``hostb``; needs root),
one rank SIGKILLed right after setup() or while every rank loops all_reduce (the harness of
``tests/integration/init/test_init_culprit.py``). For each case and run: per survivor, seconds from the kill to
distinit's finding, and whether it names the killed rank. torch alone names nobody (gloo's "Connection closed
by peer" says a peer went away, not which), so the baseline column is the absence of a name.

    python benchmarks/bench_after_setup.py --runs 3 --out benchmarks/results/after_setup.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "integration" / "init"))
sys.path.insert(0, str(HERE.parent))  # the harness imports tests._zygote (the suite's fork server)

import test_init_culprit as harness  # noqa: E402  (the tests' own harness, so both measure the same thing)


def one(victim: int, during: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="distinit-after-setup-") as where:
        folder = Path(where)
        killed_at, pids = harness._run(folder, victim=victim, during=during)
        ranks: dict[int, dict[str, object]] = {}
        for rank in (r for r in range(harness.WORLD) if r != victim):
            path = folder / f"finding{rank}.json"
            if not path.exists():
                ranks[rank] = {"named": False, "seconds": None, "message": None}
                continue
            finding = json.loads(path.read_text())
            message = str(finding["message"])
            ranks[rank] = {
                "named": f"went away: rank {victim} (host {harness.HOSTS[victim]}, pid {pids[victim]})" in message,
                "seconds": round(float(finding["at"]) - killed_at, 3),
                "message": message,
            }
        return {"victim": victim, "during": during, "ranks": ranks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "after_setup.json")
    args = parser.parse_args()
    reason = harness._uts_available()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    runs = []
    for _ in range(args.runs):
        for victim in (0, 1, 3):
            for during in (False, True):
                runs.append(one(victim, during))
                print(json.dumps(runs[-1])[:400], flush=True)
    findings = [r for run in runs for r in run["ranks"].values()]  # type: ignore[attr-defined]
    seconds = [float(f["seconds"]) for f in findings if f["seconds"] is not None]
    summary = {
        "findings": len(findings),
        "named_right": sum(1 for f in findings if f["named"]),
        "median_s": round(statistics.median(seconds), 3) if seconds else None,
        "max_s": round(max(seconds), 3) if seconds else None,
        "torch_alone": "names no rank (gloo: 'Connection closed by peer')",
    }
    meta = {"command": " ".join(sys.argv), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.write_text(json.dumps({"summary": summary, "runs": runs, "meta": meta}, indent=1))
    print(json.dumps(summary))
    return 0 if summary["named_right"] == len(findings) else 1


if __name__ == "__main__":
    raise SystemExit(main())
