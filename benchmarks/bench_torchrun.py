"""Benchmark: ``torchrun --rdzv-backend=distinit`` against ``--rdzv-backend=c10d``, side by side in one run.

1. happy path: time from starting every agent at once to the last worker started (the worker's first line
   records the instant), and the CPU seconds (user + system) of the agents and of everything they reaped (their
   workers), 2 and 4 agents on this machine, rounds interleaved (c10d first in even rounds, distinit first in odd
   ones) and never overlapping, so that the benchmark's ``RUSAGE_CHILDREN`` delta around a round is that round's
   (agents are its children; each agent's reaped workers count into the agent's). With ``--burners N`` the rounds
   run a second time beside N busy loops per core (``scripts/burners.py``), which are reaped only after the last
   round. Issue 35's budgets: CPU per round <= 1.2 x c10d, wall <= c10d + 0.3 s;
2. time to a verdict, one agent per scenario (two for the mismatch); c10d's scenarios all at once (they wait
   on timeouts), then distinit's one at a time (so start-up is not shared by twelve agents on two cores):
   ``refused`` (nothing listens, ``is_host=0``), ``foreign`` (a silent listener on the port), ``dns`` (a name
   that does not resolve), ``mismatch`` (``--nnodes=2`` and ``--nnodes=3``), ``missing`` (a node never starts,
   ``join_timeout=10``), and ``blackhole`` (nftables drops the port, in a network namespace; root only).
   Each records the seconds to the agent's exit, the last error line and whether it names the cause; an
   agent still running at ``--limit`` seconds is killed and recorded as "no verdict". distinit runs with its
   defaults except ``connect_timeout=5`` for ``refused`` (its default, 30 s, leaves a late host agent time).

Usage: ``python benchmarks/bench_torchrun.py [--repeats 3] [--limit 100] [--burners N] [--only happy] [--out DIR]``.
Prints a table and writes ``DIR/torchrun.{md,json}`` (default ``benchmarks/results``); ``--only happy`` skips the
verdict scenarios (minutes) and writes ``DIR/torchrun_happy.{md,json}`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "init"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # init_launch imports tests._zygote
from init_launch import HoldingListener  # a foreign program on a port: accepts, never answers

from _common import load_average, machine_facts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from burners import burning  # busy loops, stopped by pid

RESULTS = Path(__file__).resolve().parent / "results"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WORKER = "import os, sys, time; open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(repr(time.time()))"
#: What a verdict must contain to count as naming the cause, per scenario (distinit's wording).
CAUSES = {
    "refused": "connection refused",
    "foreign": "not a torch store",
    "dns": "does not resolve",
    "mismatch": "--nnodes",
    "missing": "never started",
    "blackhole": "packets vanish",
}
FAST = "last_call_timeout=1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agent(
    backend: str, endpoint: str, nnodes: int, conf: str, marks: Path, log: Path, prefix: list[str] | None = None
) -> subprocess.Popen[bytes]:
    script = marks.parent / "worker.py"
    script.write_text(WORKER + "\n")
    command = [
        *(prefix or []),
        TORCHRUN,
        f"--nnodes={nnodes}",
        "--nproc-per-node=1",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=bench",
        f"--rdzv-conf={conf}",
        "--monitor-interval=0.1",
        str(script),
        str(marks),
    ]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "RANK", "WORLD_SIZE"))}
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _children_cpu() -> float:
    """CPU seconds (user + system) of every child this process has reaped, and of what they reaped in turn."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def happy_once(backend: str, agents: int, limit: float) -> dict[str, float]:
    """One round of ``agents`` agents started at once: its wall seconds and the CPU seconds of its processes.

    ``wall_s``: to the last worker's first line; ``exit_s``: to the last agent's exit; ``cpu_s``: the agents and
    their workers (all inf when the round failed).

    The round reaps every agent before it returns, so the ``RUSAGE_CHILDREN`` delta is this round's alone (the
    caller runs rounds one after another; burners are reaped only after the last round).
    """
    with tempfile.TemporaryDirectory(prefix="bench-torchrun-") as tmp:
        marks = Path(tmp, "marks")
        marks.mkdir()
        endpoint = f"127.0.0.1:{_free_port()}"
        cpu_before = _children_cpu()
        start = time.time()
        procs = [
            _agent(backend, endpoint, agents, f"{FAST},join_timeout=120", marks, Path(tmp, f"a{i}.log"))
            for i in range(agents)
        ]
        try:
            for proc in procs:
                proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pass
        finally:
            for proc in procs:
                _kill(proc)
        ended = time.time()
        cpu = _children_cpu() - cpu_before
        times = [float(p.read_text()) for p in marks.iterdir()]
        ok = len(times) == agents and all(p.returncode == 0 for p in procs)
        if not ok:
            return {"wall_s": float("inf"), "exit_s": float("inf"), "cpu_s": float("inf")}
        return {"wall_s": max(times) - start, "exit_s": ended - start, "cpu_s": cpu}


def happy(repeats: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Interleaved rounds per agent count: per backend, each round's figures and their medians; the load."""
    out: dict[str, Any] = {}
    for agents in sizes:
        rounds: dict[str, list[dict[str, float]]] = {"c10d": [], "distinit": []}
        loads = []
        for r in range(repeats):
            loads.append(load_average()[0])
            for backend in ("c10d", "distinit") if r % 2 == 0 else ("distinit", "c10d"):
                rounds[backend].append(happy_once(backend, agents, 180.0))
        by: dict[str, Any] = {}
        for backend, rows in rounds.items():
            walls, exits, cpus = ([row[k] for row in rows] for k in ("wall_s", "exit_s", "cpu_s"))
            by[backend] = {
                "median_s": statistics.median(walls),
                "min_s": min(walls),
                "runs_s": walls,
                "exit_median_s": statistics.median(exits),
                "cpu_median_s": statistics.median(cpus),
                "cpu_runs_s": cpus,
            }
        by["cpu_ratio"] = by["distinit"]["cpu_median_s"] / by["c10d"]["cpu_median_s"]
        by["wall_over_s"] = by["distinit"]["median_s"] - by["c10d"]["median_s"]
        by["load_1min"] = loads
        out[str(agents)] = by
        print(
            f"happy {agents} agents (load {min(loads):.1f}-{max(loads):.1f}): "
            + ", ".join(f"{b} {by[b]['median_s']:.2f} s wall, {by[b]['cpu_median_s']:.2f} CPU-s" for b in rounds)
            + f"; CPU ratio {by['cpu_ratio']:.2f}, wall {by['wall_over_s']:+.2f} s",
            flush=True,
        )
    return out


def _happy_lines(title: str, table: dict[str, Any]) -> list[str]:
    lines = [
        f"{title}",
        "",
        "| agents | load (1 min) | c10d wall median (min) s | distinit wall median (min) s | wall over c10d "
        "(budget +0.3 s) | c10d CPU-s | distinit CPU-s | CPU ratio (budget 1.2) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, by in table.items():
        c, d = by["c10d"], by["distinit"]
        load = f"{min(by['load_1min']):.1f}-{max(by['load_1min']):.1f}"
        lines.append(
            f"| {n} | {load} | {c['median_s']:.2f} ({c['min_s']:.2f}) | {d['median_s']:.2f} ({d['min_s']:.2f}) | "
            f"{by['wall_over_s']:+.2f} | {c['cpu_median_s']:.2f} | {d['cpu_median_s']:.2f} | {by['cpu_ratio']:.2f} |"
        )
    return lines


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    lines = [line for line in lines if not line.startswith("Exception raised from")]
    return lines[-1][:300] if lines else ""


def _blackhole_ns(tag: str, port: int) -> tuple[str, list[str]] | None:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        return None
    name = f"distinit-bench-{tag}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    prefix = ["ip", "netns", "exec", name]
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=10)
    subprocess.run(["ip", "-n", name, "addr", "add", "10.254.99.2/24", "dev", "lo"], check=True, timeout=10)
    subprocess.run(["ip", "-n", name, "route", "add", "10.254.98.0/24", "dev", "lo"], check=True, timeout=10)
    for rule in (
        "add table inet distinit",
        "add chain inet distinit out { type filter hook output priority 0; }",
        f"add rule inet distinit out tcp dport {port} drop",
    ):
        subprocess.run([*prefix, "nft", rule], check=True, timeout=10)
    return name, prefix


Run = tuple[str, str, list[subprocess.Popen[bytes]], list[Path], float]


def _collect(runs: list[Run], limit: float) -> list[dict[str, Any]]:
    """Poll every agent of ``runs`` until all exit or ``limit`` passes; one row per run."""
    end = time.monotonic() + limit
    exited: dict[int, float] = {}  # pid -> seconds from its scenario's start to its exit
    everyone = [(proc, start) for _, _, procs, _, start in runs for proc in procs]
    while time.monotonic() < end and len(exited) < len(everyone):
        for proc, start in everyone:
            if proc.pid not in exited and proc.poll() is not None:
                exited[proc.pid] = time.monotonic() - start
        time.sleep(0.05)
    rows = []
    for scenario, backend, procs, logs, _ in runs:
        elapsed = [exited.get(proc.pid) for proc in procs]
        for proc in procs:
            _kill(proc)
        texts = [log.read_text(errors="replace") for log in logs]
        done = [e for e in elapsed if e is not None]
        rows.append(
            {
                "scenario": scenario,
                "backend": backend,
                "seconds": max(done) if len(done) == len(elapsed) else None,
                "exit_codes": [p.returncode for p in procs],
                "named": all(CAUSES[scenario] in text for text in texts),
                "error": _last_error(texts[0]),
            }
        )
    return rows


def verdicts(limit: float) -> list[dict[str, Any]]:
    """Every verdict scenario: c10d's all at once (they mostly wait), then distinit's one at a time."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-torchrun-v-"))
    silent = HoldingListener()
    namespaces: list[str] = []
    rows: list[dict[str, Any]] = []
    try:
        for backend in ("c10d", "distinit"):
            ours = backend == "distinit"
            plans: list[tuple[str, str, list[int], str, list[str] | None]] = [
                (
                    "refused",
                    f"127.0.0.2:{_free_port()}",
                    [2],
                    "is_host=0" + (",connect_timeout=5" if ours else ""),
                    None,
                ),
                ("foreign", f"127.0.0.1:{silent.port}", [2], "", None),
                ("dns", f"no-such-node.invalid:{_free_port()}", [2], "", None),
                ("mismatch", f"127.0.0.1:{_free_port()}", [2, 3], "join_timeout=600", None),
                ("missing", f"127.0.0.1:{_free_port()}", [2], "join_timeout=10", None),
            ]
            port = _free_port()
            made = _blackhole_ns(f"{backend[:4]}{os.getpid() % 10000}", port)
            if made is not None:
                namespaces.append(made[0])
                plans.append(("blackhole", f"10.254.98.1:{port}", [2], "is_host=0", made[1]))
            runs: list[Run] = []
            for scenario, endpoint, sizes, conf, prefix in plans:
                marks = tmp / f"{backend}-{scenario}"
                marks.mkdir()
                logs = [tmp / f"{backend}-{scenario}-{i}.log" for i in range(len(sizes))]
                start = time.monotonic()
                procs = [
                    _agent(backend, endpoint, n, ",".join(filter(None, (FAST, conf))), marks, log, prefix)
                    for n, log in zip(sizes, logs, strict=True)
                ]
                runs.append((scenario, backend, procs, logs, start))
                if ours:  # one at a time: the time to the verdict, not to twelve agents' start-up
                    rows += _collect(runs, limit)
                    runs = []
            rows += _collect(runs, limit)
    finally:
        silent.close()
        for name in namespaces:
            subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=float, default=100.0, help="seconds before an agent counts as no verdict")
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4], help="agent counts of the happy path")
    parser.add_argument(
        "--burners", type=int, default=0, help="also run the happy path beside N busy loops per core (default: no)"
    )
    parser.add_argument("--only", choices=["happy"], help="skip the verdict scenarios")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_at_start = load_average()
    sizes = tuple(args.agents)
    idle = happy(args.repeats, sizes)
    beside: dict[str, Any] | None = None
    if args.burners:
        with burning(args.burners) as pids:
            print(f"beside {len(pids)} burners:", flush=True)
            beside = happy(args.repeats, sizes)
    rows = [] if args.only else verdicts(args.limit)
    data: dict[str, Any] = {"machine": machine_facts(load_at_start=load_at_start), "happy": idle}
    if beside is not None:
        data["happy_burners"] = beside
        data["burners_per_core"] = args.burners
    if not args.only:
        data["verdicts"] = rows
        data["limit_s"] = args.limit
    stem = "torchrun_happy" if args.only else "torchrun"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "# torchrun: --rdzv-backend=distinit vs c10d",
        "",
        f"Machine: {data['machine']['cpus']} CPUs, torch {data['machine']['torch']}, load "
        f"{data['machine'].get('load_average_at_start')} -> {data['machine']['load_average_at_end']}. "
        f"Happy path: {args.repeats} interleaved rounds each; CPU: user + system seconds of the agents and their "
        "workers per round.",
        "",
        *_happy_lines("Happy path, no burners:", idle),
    ]
    if beside is not None:
        lines += ["", *_happy_lines(f"Happy path beside {args.burners} burners per core:", beside)]
    if rows:
        lines += ["", "| scenario | backend | seconds to exit | named | last error line |", "|---|---|---:|---|---|"]
    for row in rows:
        seconds = f"{row['seconds']:.1f}" if row["seconds"] is not None else f"none in {args.limit:g}"
        error = row["error"].replace("|", "\\|")[:160] or "-"
        lines.append(
            f"| {row['scenario']} | {row['backend']} | {seconds} | {'yes' if row['named'] else 'no'} | {error} |"
        )
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
