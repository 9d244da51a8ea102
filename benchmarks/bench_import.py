"""Benchmark: what importing distinit costs, beside ``import torch`` alone, in one run (issue 27).

Targets: ``import distinit`` <= 30 ms and ``from distinit import setup`` <= 80 ms over ``import torch``.

Every sample is a fresh interpreter that times its own steps with ``time.perf_counter``: first ``import
torch`` (the baseline, the same in every child), then the step under test, then the first
``env_from_scheduler()`` call (where a lazily built model would pay). Each step is measured twice:

- **as a user's script sees it**: right after ``import torch``. torch's import leaves a full (generation 2)
  garbage collection due; whatever allocates next pays for scanning torch's objects (100+ ms on a loaded
  2-vCPU machine), distinit or not. ``gc.callbacks`` in the child records every such pause inside the step;
- **distinit's own work**: after a ``gc.collect()`` that pays that debt first.

Plus ``import distinit`` without torch (what the pytest plugin costs every pytest session), and a control
that is not distinit at all: 30,000 empty lists right after ``import torch`` pay the same full collection. The variants
run interleaved, so load drifts hit all alike; figures are medians of ``--repeats`` (>= 10) interpreters.
``--src DIR`` measures another checkout's ``src`` instead; ``--before DIR`` measures one more (e.g. the
commit before a change), interleaved with the first, and records its rows beside them.

Usage: ``python benchmarks/bench_import.py [--repeats 12] [--src DIR] [--before DIR] [--out DIR]``. Prints a table and
writes ``DIR/import.{md,json}`` (default ``benchmarks/results``; not with ``--src``, unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

#: Issue 27's targets, in seconds over ``import torch`` alone.
TARGETS_S = {"import distinit": 0.030, "from distinit import setup": 0.080}

#: Modules worth naming when a step imports them (the usual suspects of a slow import).
WATCHED = (
    "torch",
    "pydantic",
    "pydantic_core",
    "tenacity",
    "importlib.metadata",
    "urllib.request",
    "unittest.mock",
    "asyncio",
    "zoneinfo",
)

#: The child: times ``import torch`` (unless told not to), an optional ``gc.collect()``, the step, and the
#: first ``env_from_scheduler()``; records every collection inside the step; prints one JSON line.
CHILD = r"""
import gc, json, sys, time
torch_first, collect, step, first_env = sys.argv[1] == "1", sys.argv[2] == "1", sys.argv[3], sys.argv[4] == "1"
watched = sys.argv[5].split(",")
pauses, started = [], [0.0]
def on_gc(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        pauses.append((info["generation"], time.perf_counter() - started[0]))
t0 = time.perf_counter()
if torch_first:
    import torch
t1 = time.perf_counter()
after_torch = set(sys.modules)
if collect:
    gc.collect()
gc.callbacks.append(on_gc)
c2, t2 = time.process_time(), time.perf_counter()
if step == "import distinit":
    import distinit
elif step == "from distinit import setup":
    from distinit import setup
elif step == "control: 30,000 lists":
    kept = [[] for _ in range(30_000)]
t3, c3 = time.perf_counter(), time.process_time()
in_step = list(pauses)
after_step = set(sys.modules)  # what the step imported, not the env_from_scheduler() import below
env_s = None
if first_env:
    from distinit import env_from_scheduler
    t4 = time.perf_counter()
    env_from_scheduler({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"})
    env_s = time.perf_counter() - t4
gc.callbacks.remove(on_gc)
print(json.dumps({
    "torch_s": t1 - t0,
    "step_s": t3 - t2,
    "step_cpu_s": c3 - c2,
    "first_env_s": env_s,
    "gc_pause_s": sum(s for _, s in in_step),
    "gc_full_s": sum(s for g, s in in_step if g == 2),
    "new_modules": len(after_step - after_torch),
    "new_watched": [m for m in watched if m in after_step and m not in after_torch],
    "before_step": [m for m in watched if m in after_torch],
}))
"""

#: (name, torch first, gc.collect() first, step, first env_from_scheduler()), in the order they interleave.
VARIANTS: tuple[tuple[str, bool, bool, str, bool], ...] = (
    ("import torch", True, False, "", False),
    ("import distinit | as seen", True, False, "import distinit", False),
    ("import distinit | own work", True, True, "import distinit", False),
    ("from distinit import setup | as seen", True, False, "from distinit import setup", True),
    ("from distinit import setup | own work", True, True, "from distinit import setup", True),
    ("import distinit | no torch", False, False, "import distinit", False),
    ("control: 30,000 lists | as seen", True, False, "control: 30,000 lists", False),
)


def sample(variant: tuple[str, bool, bool, str, bool], src: Path | None) -> dict[str, Any]:
    """One fresh interpreter running ``variant``; its JSON line."""
    _, torch_first, collect, step, first_env = variant
    # Bytecode may be written (the first, warm-up child writes it): a tree without it compiles every module
    # in every child, which is not what an installed package costs.
    dropped = ("PYTHONSTARTUP", "PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE")
    environ = {k: v for k, v in os.environ.items() if k not in dropped}
    if src is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), environ.get("PYTHONPATH", "")]))
    flags = ["1" if torch_first else "0", "1" if collect else "0", step, "1" if first_env else "0", ",".join(WATCHED)]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *flags], capture_output=True, text=True, timeout=300, env=environ, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant[0]}: the child failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and the spread of the step) over one variant's interpreters."""

    def med(key: str) -> float | None:
        values = [s[key] for s in samples if s[key] is not None]
        return statistics.median(values) if values else None

    steps = [s["step_s"] for s in samples]
    return {
        "runs": len(samples),
        "torch_s": med("torch_s"),
        "step_s": med("step_s"),
        "step_min_s": min(steps),
        "step_max_s": max(steps),
        "step_cpu_s": med("step_cpu_s"),
        "first_env_s": med("first_env_s"),
        "gc_pause_s": med("gc_pause_s"),
        "gc_full_s": med("gc_full_s"),
        "full_collections_in": sum(1 for s in samples if s["gc_full_s"] > 0),
        "new_modules": med("new_modules"),
        "new_watched": sorted({m for s in samples for m in s["new_watched"]}),
        "before_step": sorted({m for s in samples for m in s["before_step"]}),
    }


def verdicts(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target judged on both figures, with the measured reason where one is missed."""
    out = []
    for step, target in TARGETS_S.items():
        for how in ("as seen", "own work"):
            row = rows[f"{step} | {how}"]
            figure, cpu = row["step_s"], row["step_cpu_s"]
            met = figure <= target
            reason = ""
            if not met:
                own = rows[f"{step} | own work"]["step_s"]
                reason = (
                    f"full collections inside the step: median {row['gc_full_s'] * 1e3:.0f} ms "
                    f"(in {row['full_collections_in']} of {row['runs']} runs); distinit's own work "
                    f"{own * 1e3:.0f} ms"
                    if row["gc_full_s"] > 0
                    else f"distinit's own work: {row['new_modules']:.0f} modules imported, "
                    f"{', '.join(row['new_watched']) or 'no watched module'}"
                )
            out.append(
                {
                    "target": f"{step} <= {target * 1e3:.0f} ms over import torch",
                    "figure": how,
                    "measured_s": figure,
                    "target_s": target,
                    "met": met,
                    "cpu_s": cpu,
                    "met_on_cpu": cpu <= target,
                    "reason": reason,
                }
            )
    return out


def table(results: dict[str, Any]) -> str:
    rows, base = results["rows"], results["rows"]["import torch"]["torch_s"]
    lines = [
        f"# distinit import benchmark ({results['machine']})",
        "",
        f"Fresh interpreters, median of {results['repeats']} each, variants interleaved. `import torch` alone: "
        f"{base * 1e3:.0f} ms (median). Source: `{results['src']}`.",
        "",
        "| step | after | median | min..max | CPU time (median) | full GC inside (median) | first env_from_scheduler() "
        "| new modules |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        if name == "import torch":
            continue
        step, how = name.split(" | ")
        after = {
            "as seen": "import torch",
            "own work": "import torch; gc.collect()",
            "no torch": "nothing (bare python)",
        }[how]
        env = f"{row['first_env_s'] * 1e3:.1f} ms" if row["first_env_s"] is not None else ""
        lines.append(
            f"| `{step}` | `{after}` | {row['step_s'] * 1e3:.1f} ms | {row['step_min_s'] * 1e3:.0f}.."
            f"{row['step_max_s'] * 1e3:.0f} ms | {row['step_cpu_s'] * 1e3:.1f} ms | {row['gc_full_s'] * 1e3:.0f} ms "
            f"| {env} | {row['new_modules']:.0f} |"
        )
    lines += [
        "",
        "Judged on the wall-clock median (what a user waits); the CPU-time median beside it barely moves with the",
        "machine's load (it leaves out the time this process waited for a core).",
        "",
        "| target | figure | wall median | verdict | CPU median | on CPU time |",
        "|---|---|---:|---|---:|---|",
    ]
    for v in results["verdicts"]:
        verdict = "met" if v["met"] else f"MISSED: {v['reason']}"
        on_cpu = "met" if v["met_on_cpu"] else "missed"
        lines.append(
            f"| {v['target']} | {v['figure']} | {v['measured_s'] * 1e3:.1f} ms | {verdict} | "
            f"{v['cpu_s'] * 1e3:.1f} ms | {on_cpu} |"
        )
    if "before" in results:
        then = results["before"]["rows"]
        lines += [
            "",
            f"Before/after, interleaved in this run (before: `{results['before']['src']}`):",
            "",
            "| step | after | wall: before | this | CPU: before | this | first env_from_scheduler(): before | this |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in rows.items():
            if name == "import torch":
                continue
            old = then[name]
            envs = [f"{r['first_env_s'] * 1e3:.1f} ms" if r["first_env_s"] is not None else "" for r in (old, row)]
            step, how = name.split(" | ")
            cells = [f"{r[key] * 1e3:.1f} ms" for key in ("step_s", "step_cpu_s") for r in (old, row)]
            lines.append(f"| `{step}` | {how} | {' | '.join(cells)} | {envs[0]} | {envs[1]} |")
    setup = rows["from distinit import setup | as seen"]
    lines += [
        "",
        f"Already imported by `import torch`, so free for distinit: {', '.join(setup['before_step']) or 'none'}. "
        f"Imported by `from distinit import setup`: {', '.join(setup['new_watched']) or 'none of the watched'}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12, help="fresh interpreters per variant (>= 10)")
    parser.add_argument("--src", type=Path, help="measure this checkout's src directory instead of the installed one")
    parser.add_argument("--before", type=Path, help="also measure this src directory, interleaved (before/after)")
    parser.add_argument("--out", type=Path, help="where to write import.{md,json} (default benchmarks/results)")
    args = parser.parse_args()
    repeats = max(10, args.repeats)
    src = args.src.resolve() if args.src else None
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    before = args.before.resolve() if args.before else None
    trees = {"this": src, **({"before": before} if before else {})}
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {t: {v[0]: [] for v in VARIANTS} for t in trees}
    for path in trees.values():  # warm-up, not recorded: writes the bytecode and warms the page cache
        sample(VARIANTS[3], path)
    for _ in range(repeats):
        for variant in VARIANTS:  # interleaved, and each tree beside the other
            for tree, path in trees.items():
                samples[tree][variant[0]].append(sample(variant, path))
    rows = {name: summarise(s) for name, s in samples["this"].items()}
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "repeats": repeats,
        "src": str(src) if src else "installed distinit",
        "targets_s": TARGETS_S,
        "rows": rows,
    }
    results["verdicts"] = verdicts(rows)
    if before is not None:
        results["before"] = {"src": str(before), "rows": {n: summarise(s) for n, s in samples["before"].items()}}
    text = table(results)
    print(text)
    from _common import machine_facts

    results["machine_facts"] = machine_facts(load_at_start=load_at_start)
    out = args.out or (None if src else RESULTS)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for suffix, body in (("md", text), ("json", json.dumps(results, indent=2))):
            (out / f"import.{suffix}").write_text(body + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
