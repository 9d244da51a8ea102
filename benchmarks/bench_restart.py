"""Benchmark: a worker failure under ``torchrun --max-restarts=1``, ``--rdzv-backend=distinit`` against ``c10d``.

The setup of issue 31, item 2: two agents on 127.0.0.1 (``--nnodes=2``, ``--rdzv-conf join_timeout=20``), a
worker that forms a gloo group from torchrun's variables, all-reduces, and raises on its first attempt
(``TORCHELASTIC_RESTART_COUNT=0``) on every rank, rank 0 three seconds after rank 1 (so rank 0's agent sees the
failed node re-join while its own worker still runs: torch's uncounted membership change). The worker is
``tests/integration/rendezvous/_restart_worker.py`` (``@record``, so torch writes its error file).

Each run records, per agent: its exit code (``killed`` when it still ran at ``--limit`` seconds: no verdict), its
seconds from the start, and the ``TORCHELASTIC_RESTART_COUNT`` its workers saw; per run, the outcome:
``recovered`` (both agents exit 0 and both workers all-reduced at restart 1), ``verdict`` (both agents exit
non-zero, neither killed), ``split`` (one agent exits 0, the other fails: no common verdict) or ``silent`` (an
agent killed at the limit). Backends alternate (c10d, distinit, ...).

Usage: ``python benchmarks/bench_restart.py [--repeats 5] [--limit 100] [--out DIR]``. Prints a table and writes
``DIR/restart.{md,json}`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_average, machine_facts

RESULTS = Path(__file__).resolve().parent / "results"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WORKER = Path(__file__).resolve().parents[1] / "tests" / "integration" / "rendezvous" / "_restart_worker.py"
RESTART_LINE = "rendezvous 'job': round 0 ended"
ENV = {"DISTINIT_TEST_FAIL": "once", "DISTINIT_TEST_FAIL_RANKS": "1,0@3", "OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL an agent and its workers (torchrun starts each worker in a session of its own)."""
    workers = [pid for pid in _pids() if _parent(pid) == proc.pid]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def run_once(backend: str, limit: float, tmp: Path) -> dict[str, Any]:
    """Two agents for one failure; their exits, times, counts and the outcome."""
    port = _free_port()
    command = [
        TORCHRUN,
        "--nnodes=2",
        "--nproc-per-node=1",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=job",
        "--max-restarts=1",
        "--rdzv-conf=join_timeout=20",
        "--monitor-interval=0.2",
        str(WORKER),
    ]
    environ = {**os.environ, **ENV, "DISTINIT_TEST_RELEASE": str(tmp / "never")}
    start = time.monotonic()
    agents = []
    for name in ("a", "b"):
        log = tmp / f"{backend}-{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
        agents.append((proc, log))
    exits: dict[int, tuple[int | str, float]] = {}
    while len(exits) < len(agents) and time.monotonic() < start + limit:
        for index, (proc, _) in enumerate(agents):
            if index not in exits:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    exits[index] = (proc.wait(timeout=0.1), time.monotonic() - start)
    rows = []
    for index, (proc, log) in enumerate(agents):
        if index not in exits:
            _kill(proc)
            exits[index] = ("killed", limit)
        rc, seconds = exits[index]
        text = log.read_text(errors="replace")
        rows.append(
            {
                "rc": rc,
                "seconds": round(seconds, 1),
                "counts": re.findall(r"worker rank=\d+ world=2 sum=2 restart=(\d+)", text),
                "restart_line": next((line for line in text.splitlines() if RESTART_LINE in line), ""),
                "last": next((line for line in reversed(text.splitlines()) if "Error" in line), "")[-200:],
                "recovered": "sum=2 restart=1" in text,
            }
        )
    return {"backend": backend, "outcome": outcome(rows), "agents": rows, "load": load_average()}


def outcome(rows: list[dict[str, Any]]) -> str:
    """One run's outcome: ``recovered``, ``verdict``, ``split`` or ``silent`` (see the module docstring)."""
    if any(row["rc"] == "killed" for row in rows):
        return "silent"
    if all(row["rc"] == 0 and row["recovered"] for row in rows):
        return "recovered"
    return "verdict" if all(row["rc"] != 0 for row in rows) else "split"


def report(runs: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    """The markdown table of ``runs`` and each backend's tally (outcomes recomputed from the agents' rows)."""
    lines = [
        "# A worker failure under torchrun --max-restarts=1: c10d against distinit",
        "",
        f"`{machine['command']}` on {machine['cpus']} CPUs, {machine['when']}; torch {machine['torch']}; load "
        f"average {machine.get('load_average_at_start')} at the start, {machine['load_average_at_end']} at the end.",
        "An agent's counts: the TORCHELASTIC_RESTART_COUNT of each of its workers that all-reduced, in order; its "
        "seconds are from the start of both agents to its exit.",
        "",
        "| backend | run | outcome | agent a | agent b |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        cells = [
            f"rc {row['rc']}, {row['seconds']} s, counts {','.join(row['counts']) or '-'}" for row in run["agents"]
        ]
        lines.append(f"| {run['backend']} | {run['repeat']} | {outcome(run['agents'])} | {cells[0]} | {cells[1]} |")
    for backend in ("c10d", "distinit"):
        mine = [outcome(run["agents"]) for run in runs if run["backend"] == backend]
        tally = ", ".join(f"{mine.count(o)} {o}" for o in ("recovered", "verdict", "split", "silent"))
        lines.extend(["", f"{backend}: {tally} of {len(mine)}."])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--limit", type=float, default=100.0, help="seconds before an agent counts as silent")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--report-only", action="store_true", help="rewrite DIR/restart.md from DIR/restart.json")
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((args.out / "restart.json").read_text())
        (args.out / "restart.md").write_text(report(saved["runs"], saved["machine"]))
        return
    load_at_start = load_average()
    runs = []
    for repeat in range(args.repeats):
        for backend in ("c10d", "distinit"):
            with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
                run = run_once(backend, args.limit, Path(tmp))
            run["repeat"] = repeat + 1
            runs.append(run)
            agents = "; ".join(f"rc={row['rc']} at {row['seconds']} s, counts {row['counts']}" for row in run["agents"])
            print(f"{backend:8} run {repeat + 1}: {run['outcome']:9} ({agents})", flush=True)
    machine = machine_facts(load_at_start=load_at_start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "restart.json").write_text(json.dumps({"machine": machine, "runs": runs}, indent=2) + "\n")
    text = report(runs, machine)
    (args.out / "restart.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
