"""Benchmark: ``distinit doctor``, measured on this machine in one run.

1. local checks: ``env`` plus every other local check in-process, torch already imported (the issue's
   budget: <= 0.1 s per rank), median over repeats, per check and in total;
2. the whole doctor at world 4 against a bare ``init_process_group("gloo")`` + ``barrier``, side by side in
   one run: four processes import torch, signal ready, start at one instant; time to the last rank done;
3. ``reach`` with simulated hosts: one listener per host on distinct loopback addresses (127.0.x.y), every
   host probing its plan concurrently (threads); 16..256 hosts for real, and the sampled plan at 1024 and
   4096 hosts (plan size and cost of computing it; 1024 also for real unless ``--quick``);
4. ``nodes``: :func:`distinit._identity.group_ranks` on 4096 ranks over 512 hosts;
5. ``--help`` (issue 27: <= 0.3 s, no torch imported): ``distinit --help``, ``distinit doctor --help`` and
   ``distinit env --help`` in fresh interpreters, median of ``--help-repeats`` (>= 10) interleaved runs, beside
   ``python -c "import torch"`` for scale.

Usage: ``python benchmarks/bench_doctor.py [--repeats 3] [--quick] [--out DIR]``. Prints a table and
writes ``DIR/doctor.{md,json}`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def worker(mode: str) -> None:
    """One rank: import, signal READY, wait for the start instant, run ``mode``, print the end time."""
    import torch.distributed as dist

    from distinit.doctor import run

    print("READY", flush=True)
    start = float(sys.stdin.readline())
    while time.time() < start:
        time.sleep(0.001)
    if mode == "bare":
        dist.init_process_group("gloo")
        dist.barrier()
        dist.destroy_process_group()
        ok = True
    else:
        ok = run(timeout=60).ok
    print(json.dumps({"end": time.time(), "ok": ok}), flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def world_once(mode: str, world_size: int = 4) -> float:
    """Seconds from the common start instant to the last of ``world_size`` ranks finishing ``mode``."""
    port = _free_port()
    procs = []
    for rank in range(world_size):
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "GLOO_", "TORCHELASTIC_"))}
        environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONWARNINGS="ignore",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", mode],
                env=environ,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in procs:
            assert proc.stdout is not None
            first = proc.stdout.readline().strip()
            if first != "READY":
                proc.wait(timeout=30)
                raise RuntimeError(
                    f"a {mode} rank did not start ({first!r}): {proc.stderr.read()[-2000:] if proc.stderr else ''}"
                )
        start = time.time() + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.flush()
        ends = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            result = json.loads(out.strip().splitlines()[-1])
            assert result["ok"], f"{mode} failed"
            ends.append(result["end"])
        return max(ends) - start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def local_checks(repeats: int) -> dict[str, Any]:
    """Median seconds of the local checks, per check and in total (torch imported beforehand)."""
    import torch  # noqa: F401

    from distinit._identity import local_identity
    from distinit.doctor._local import check_env, run_local

    environ = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    totals, per_check = [], {}
    for _ in range(repeats + 1):  # the first is a warm-up
        started = time.perf_counter()
        env, first = check_env(strict=True, environ=environ)
        checks = [first, *run_local(env, identity=local_identity(environ), environ=environ, budget=lambda: 10.0)]
        totals.append(time.perf_counter() - started)
        for check in checks:
            per_check.setdefault(check.id, []).append(float(check.evidence.get("elapsed_s", 0.0)))
    return {
        "total_s": statistics.median(totals[1:]),
        "per_check_s": {k: statistics.median(v[1:]) for k, v in per_check.items()},
    }


def _address(i: int) -> str:
    return f"127.0.{i // 250}.{i % 250 + 1}"


def reach_simulated(hosts: int) -> dict[str, Any]:
    """``hosts`` listeners on distinct loopback addresses; every host probes its plan at once."""
    from distinit.doctor._listener import Listener
    from distinit.doctor._reach import probe_all, reach_plan

    listeners = [Listener(_address(i)) for i in range(hosts)]
    try:
        started = time.perf_counter()
        plan = reach_plan(hosts)
        planned = time.perf_counter() - started
        endpoints = [(lst.address, lst.port) for lst in listeners]
        with ThreadPoolExecutor(max_workers=min(hosts, 32)) as pool:
            outcome = list(pool.map(lambda t: probe_all([endpoints[j] for j in t], timeout=3.0), plan))
        elapsed = time.perf_counter() - started
    finally:
        for lst in listeners:
            lst.close()
    failures = sum(1 for row in outcome for why in row if why)
    pairs = sum(len(t) for t in plan)
    return {"hosts": hosts, "pairs": pairs, "failures": failures, "plan_s": planned, "elapsed_s": elapsed}


def plan_only(hosts: int) -> dict[str, Any]:
    from distinit.doctor._reach import reach_plan

    started = time.perf_counter()
    plan = reach_plan(hosts)
    return {
        "hosts": hosts,
        "pairs": sum(len(t) for t in plan),
        "per_host": len(plan[0]),
        "plan_s": time.perf_counter() - started,
    }


def nodes_at_scale(ranks: int = 4096, per_host: int = 8) -> float:
    from distinit._identity import HostIdentity, RankClaim, group_ranks

    hosts = [HostIdentity(hostname=f"n{i:04d}", boot_id=f"b{i}") for i in range(ranks // per_host)]
    claims = [
        RankClaim(
            rank=r,
            identity=hosts[r // per_host],
            node_rank=r // per_host,
            local_rank=r % per_host,
            local_world_size=per_host,
        )
        for r in range(ranks)
    ]
    started = time.perf_counter()
    layout = group_ranks(claims)
    assert not layout.conflicts
    return time.perf_counter() - started


#: ``--help`` must answer within this many seconds (issue 27).
HELP_TARGET_S = 0.3


def help_times(repeats: int) -> dict[str, Any]:
    """Median wall seconds of each ``--help`` in a fresh interpreter, and of ``import torch`` for scale."""
    distinit = str(Path(sys.executable).with_name("distinit"))
    commands = {
        "distinit --help": [distinit, "--help"],
        "distinit doctor --help": [distinit, "doctor", "--help"],
        "distinit env --help": [distinit, "env", "--help"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
    }
    runs: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():  # interleaved, so load drifts hit all alike
            started = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, timeout=120)
            runs[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(v) for name, v in runs.items()}
    helps = [v for name, v in medians.items() if name.startswith("distinit")]
    return {
        "repeats": repeats,
        "median_s": medians,
        "max_s": {name: max(v) for name, v in runs.items()},
        "target_s": HELP_TARGET_S,
        "met": max(helps) <= HELP_TARGET_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--help-repeats", type=int, default=10, help="fresh interpreters per --help (>= 10)")
    parser.add_argument("--only-help", action="store_true", help="measure --help only (writes doctor_help.*)")
    parser.add_argument("--worker", choices=("bare", "doctor"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus, python {platform.python_version()}"
    }
    results["help"] = help_times(max(10, args.help_repeats))
    help_lines = [
        f"| {name} | {v * 1000:.0f} ms | {results['help']['max_s'][name] * 1000:.0f} ms |"
        for name, v in results["help"]["median_s"].items()
    ]
    help_table = [
        f"`--help` in a fresh interpreter, median of {results['help']['repeats']} (target <= "
        f"{HELP_TARGET_S * 1000:.0f} ms: {'met' if results['help']['met'] else 'MISSED'}):",
        "",
        "| command | median | slowest |",
        "|---|---|---|",
        *help_lines,
    ]
    if args.only_help:
        print("\n".join(help_table))
        return 0 if results["help"]["met"] else 1
    results["local"] = local_checks(args.repeats * 10)
    pairs: dict[str, list[float]] = {"bare": [], "doctor": []}
    for _ in range(args.repeats):
        for mode in ("bare", "doctor"):  # interleaved, so load drifts hit both alike
            pairs[mode].append(world_once(mode))
    results["world4"] = {mode: statistics.median(v) for mode, v in pairs.items()}
    results["world4"]["extra_s"] = results["world4"]["doctor"] - results["world4"]["bare"]
    sizes = (16, 64, 128, 256) if args.quick else (16, 64, 128, 256, 1024)
    results["reach"] = [reach_simulated(n) for n in sizes]
    results["plan"] = [plan_only(n) for n in (1024, 4096)]
    results["nodes_4096_s"] = nodes_at_scale()
    lines = [
        f"# distinit doctor benchmark ({results['machine']})",
        "",
        f"- local checks, total median: {results['local']['total_s'] * 1000:.1f} ms "
        + "("
        + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in results["local"]["per_check_s"].items())
        + ")",
        f"- world 4, start instant to last rank done (median of {args.repeats}): bare init_process_group + barrier "
        f"{results['world4']['bare']:.2f} s, distinit doctor {results['world4']['doctor']:.2f} s "
        f"(+{results['world4']['extra_s']:.2f} s)",
        f"- nodes: group_ranks over 4096 ranks / 512 hosts: {results['nodes_4096_s'] * 1000:.1f} ms",
        "",
        "| simulated hosts | pairs probed | failures | wall s |",
        "|---|---|---|---|",
        *(f"| {r['hosts']} | {r['pairs']} | {r['failures']} | {r['elapsed_s']:.2f} |" for r in results["reach"]),
        "",
        "| sampled plan, hosts | pairs | per host | plan computed in |",
        "|---|---|---|---|",
        *(f"| {r['hosts']} | {r['pairs']} | {r['per_host']} | {r['plan_s'] * 1000:.1f} ms |" for r in results["plan"]),
        "",
        *help_table,
    ]
    text = "\n".join(lines)
    print(text)
    from _common import machine_facts

    results["machine_facts"] = machine_facts(load_at_start=load_at_start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "doctor.md").write_text(text + "\n")
    (args.out / "doctor.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["help"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
