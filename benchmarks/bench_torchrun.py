"""Benchmark: ``torchrun --rdzv-backend=distinit`` against ``--rdzv-backend=c10d``, side by side in one run.

1. happy path: time from starting every agent at once to the last worker started (the worker's first line
   records the instant), 2 and 4 agents on this machine, rounds interleaved (c10d, distinit, c10d, ...);
   the issue's budget: distinit <= c10d + 10 % or + 0.3 s;
2. time to a verdict, one agent per scenario (two for the mismatch); c10d's scenarios all at once (they wait
   on timeouts), then distinit's one at a time (so start-up is not shared by twelve agents on two cores):
   ``refused`` (nothing listens, ``is_host=0``), ``foreign`` (a silent listener on the port), ``dns`` (a name
   that does not resolve), ``mismatch`` (``--nnodes=2`` and ``--nnodes=3``), ``missing`` (a node never starts,
   ``join_timeout=10``), and ``blackhole`` (nftables drops the port, in a network namespace; root only).
   Each records the seconds to the agent's exit, the last error line and whether it names the cause; an
   agent still running at ``--limit`` seconds is killed and recorded as "no verdict". distinit runs with its
   defaults except ``connect_timeout=5`` for ``refused`` (its default, 30 s, leaves a late host agent time).

Usage: ``python benchmarks/bench_torchrun.py [--repeats 3] [--limit 100] [--out DIR]``. Prints a table and writes
``DIR/torchrun.{md,json}`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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


def happy_once(backend: str, agents: int, limit: float) -> float:
    """Seconds from starting ``agents`` agents at once to the last worker's first line (inf on failure)."""
    with tempfile.TemporaryDirectory(prefix="bench-torchrun-") as tmp:
        marks = Path(tmp, "marks")
        marks.mkdir()
        endpoint = f"127.0.0.1:{_free_port()}"
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
        times = [float(p.read_text()) for p in marks.iterdir()]
        return max(times) - start if len(times) == agents else float("inf")


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
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_at_start = load_average()
    happy: dict[str, dict[str, list[float]]] = {}
    for agents in (2, 4):
        runs: dict[str, list[float]] = {"c10d": [], "distinit": []}
        for _ in range(args.repeats):
            for backend in ("c10d", "distinit"):
                runs[backend].append(happy_once(backend, agents, 180.0))
        happy[str(agents)] = runs
        print(f"happy {agents} agents: " + ", ".join(f"{b} {statistics.median(v):.2f} s" for b, v in runs.items()))
    rows = verdicts(args.limit)
    data = {
        "machine": machine_facts(load_at_start=load_at_start),
        "happy": {
            n: {b: {"median_s": statistics.median(v), "min_s": min(v), "runs_s": v} for b, v in runs.items()}
            for n, runs in happy.items()
        },
        "verdicts": rows,
        "limit_s": args.limit,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torchrun.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "# torchrun: --rdzv-backend=distinit vs c10d",
        "",
        f"Machine: {data['machine']['cpus']} CPUs, torch {data['machine']['torch']}, load "
        f"{data['machine'].get('load_average_at_start')} -> {data['machine']['load_average_at_end']}.",
        "",
        "| agents | c10d median (min) s | distinit median (min) s | budget (c10d + max(10 %, 0.3 s)) |",
        "|---:|---:|---:|---:|",
    ]
    for n, by in data["happy"].items():
        c, d = by["c10d"], by["distinit"]
        budget = c["median_s"] + max(0.1 * c["median_s"], 0.3)
        lines.append(
            f"| {n} | {c['median_s']:.2f} ({c['min_s']:.2f}) | {d['median_s']:.2f} ({d['min_s']:.2f}) | {budget:.2f} |"
        )
    lines += ["", "| scenario | backend | seconds to exit | named | last error line |", "|---|---|---:|---|---|"]
    for row in rows:
        seconds = f"{row['seconds']:.1f}" if row["seconds"] is not None else f"none in {args.limit:g}"
        error = row["error"].replace("|", "\\|")[:160] or "-"
        lines.append(
            f"| {row['scenario']} | {row['backend']} | {seconds} | {'yes' if row['named'] else 'no'} | {error} |"
        )
    (args.out / "torchrun.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
