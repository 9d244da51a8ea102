"""How each capability grows with the world: measured on this machine where it can be simulated, bounded.

Run:  .venv/bin/python benchmarks/bench_scale.py [--quick] [--join 64 256 1024 4096] [--worlds 2 4 8 16]

1. init: the join protocol with N simulated ranks (threads, one TCPStore client each) against one TCPStore:
   connect time (and each connect's latency: a connect slower than 1 s is counted), join time, errors,
   store keys per rank. Sizes stop early once one size took longer than ``--budget`` seconds.
2. env: ``expand_hostlist`` of a 100,000-host list and ``env_from_scheduler`` for rank 99,999 of a
   100,000-task Slurm step (``8(x12500)`` tasks per node).
3. broadcast: the header exchange against world size on gloo (2 ... 16 processes on this machine), beside a
   raw 1 KB broadcast and the alternatives the cost model weighs: an all_gather of the same rows, an
   all-to-all of 64-byte rows (a digest) and an all_reduce of 4 words; plus the bytes each rank sends.
4. computed, not measured: bytes, connections, keys, files and wake-ups at 1k, 10k and 100k ranks
   (the formulas are in ``docs/scale.md``).

Prints a table and writes ``benchmarks/results/scale.{md,json}``. Nothing here runs longer than a few
minutes; every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SCALES = (1_000, 10_000, 100_000)
PARTS = ("join", "store", "env", "header")


# ----------------------------------------------------------------------------------------------- 1. join
def join_row(n: int) -> dict[str, Any]:
    """Connect ``n`` clients (64 at a time) to one TCPStore, then run the join protocol on all of them."""
    import torch.distributed as dist

    from bench_init import _join_one  # one simulated rank: the same code as bench_init.py's scale rows

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    port = server.port

    def connect(_: int) -> tuple[Any, float]:
        began = time.monotonic()
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(60))
        return client, time.monotonic() - began

    started = time.monotonic()
    with ThreadPoolExecutor(64) as pool:
        made = list(pool.map(connect, range(n)))
    connected = time.monotonic() - started
    latencies = sorted(t for _, t in made)
    errors: list[BaseException] = []
    barrier = threading.Barrier(n + 1)
    threads = [
        threading.Thread(target=_join_one, args=(r, n, c, port, barrier, errors), daemon=True)
        for r, (c, _) in enumerate(made)
    ]
    for t in threads:
        t.start()
    barrier.wait()
    begun = time.monotonic()
    for t in threads:
        t.join(max(1.0, 90 - (time.monotonic() - begun)))  # each rank waits at most 60 s
    joined = time.monotonic() - begun
    keys = server.num_keys()
    stuck = sum(t.is_alive() for t in threads)
    del made, threads
    return {
        "ranks": n,
        "connect_s": connected,
        "connect_p50_ms": 1000 * latencies[len(latencies) // 2],
        "connect_max_ms": 1000 * latencies[-1],
        "connects_over_1s": sum(t > 1.0 for t in latencies),
        "join_s": joined,
        "errors": len(errors) + stuck,
        "error_kinds": sorted({type(e).__name__ for e in errors}),
        "store_keys": keys,
        "keys_per_rank": keys / n,
    }


def join_rows(sizes: list[int], budget: float) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        row = join_row(n)
        rows.append(row)
        print(
            f"  join {n}: connect {row['connect_s']:.2f} s ({row['connects_over_1s']} over 1 s), "
            f"join {row['join_s']:.2f} s, errors {row['errors']}",
            flush=True,
        )
        if row["connect_s"] + row["join_s"] > budget:
            print(f"  join: {n} took over {budget:.0f} s; larger sizes skipped", flush=True)
            break
    return rows


def store_rate(clients: int = 32, seconds: float = 2.0) -> dict[str, Any]:
    """Store operations per second one TCPStore serves to ``clients`` threads doing ``set`` then ``check``.

    The clients connect first (connects can stall: see docs/scale.md); only the operations are timed.
    """
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    with ThreadPoolExecutor(clients) as pool:
        stores = list(
            pool.map(
                lambda _: dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30)),
                range(clients),
            )
        )
    counts = [0] * clients
    go = threading.Barrier(clients + 1)

    def hammer(i: int) -> None:
        go.wait()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            stores[i].set(f"beat/{i}", str(counts[i]))
            stores[i].check([f"beat/{i}"])
            counts[i] += 2

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    go.wait()
    began = time.monotonic()
    for t in threads:
        t.join(seconds + 30)
    return {"clients": clients, "ops": sum(counts), "ops_per_s": sum(counts) / (time.monotonic() - began)}


# ----------------------------------------------------------------------------------------------- 2. env
def _median_s(fn: Callable[[], Any], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def env_rows() -> dict[str, Any]:
    from distinit.env import env_from_scheduler
    from distinit.env._hostlist import expand_hostlist

    hosts = "a[000000-049999],b[000000-049999]"  # Slurm caps one range at 65,536 values
    slurm = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "99999",
        "SLURM_NODEID": "12499",
        "SLURM_LOCALID": "7",
        "SLURM_NTASKS": "100000",
        "SLURM_STEP_NUM_TASKS": "100000",
        "SLURM_JOB_NODELIST": "n[00000-12499]",
        "SLURM_STEP_NODELIST": "n[00000-12499]",
        "SLURM_STEP_TASKS_PER_NODE": "8(x12500)",
        "SLURM_TASKS_PER_NODE": "8(x12500)",
    }
    env = env_from_scheduler(slurm)
    return {
        "hostlist_100k_hosts": len(expand_hostlist(hosts)),
        "hostlist_100k_s": _median_s(lambda: expand_hostlist(hosts)),
        "env_rank": env.rank,
        "env_world_size": env.world_size,
        "env_master_addr": env.master_addr,
        "env_100k_s": _median_s(lambda: env_from_scheduler(slurm)),
    }


# ----------------------------------------------------------------------------------------------- 3. header
def _header_worker(rank: int, world: int, store: str, reps: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from bench_broadcast import compare
    from distinit.broadcast import _header

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        row = _header.HEADER_WORDS
        rows_in, rows_out = torch.zeros(world * row, dtype=torch.int64), torch.empty(world * row, dtype=torch.int64)
        digest_in, digest_out = torch.zeros(world * 8, dtype=torch.int64), torch.empty(world * 8, dtype=torch.int64)
        gathered = torch.empty(world * row, dtype=torch.int64)
        one_row, words, small = torch.zeros(row, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), torch.zeros(256)
        result = compare(
            {
                "raw broadcast, 1 KB": lambda: dist.broadcast(small, 0),
                f"header all-to-all ({_header.HEADER_BYTES} B rows)": lambda: dist.all_to_all_single(rows_out, rows_in),
                f"all_gather of the same {_header.HEADER_BYTES} B row": lambda: dist.all_gather_into_tensor(
                    gathered, one_row
                ),
                "all-to-all of 64 B rows (a digest)": lambda: dist.all_to_all_single(digest_out, digest_in),
                "all_reduce of 4 words": lambda: dist.all_reduce(words),
            },
            reps,
            inner=5,
            warmup=3,
        )
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def header_rows(worlds: list[int], reps: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    from distinit.broadcast._header import HEADER_BYTES

    rows = []
    ctx = mp.get_context("spawn")
    for world in worlds:
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            procs = [ctx.Process(target=_header_worker, args=(r, world, store, reps, queue)) for r in range(world)]
            for p in procs:
                p.start()
            try:
                result = queue.get(timeout=300)
            finally:
                for p in procs:
                    p.join(60)
                    if p.is_alive():
                        p.kill()
        rows.append({"world": world, "bytes_sent_per_rank": world * HEADER_BYTES, "cases": result})
        print(f"  header exchange, world {world}: done", flush=True)
    return rows


# ----------------------------------------------------------------------------------------------- 4. computed
def computed() -> dict[str, Any]:
    """The cost model at 1k, 10k and 100k ranks (formulas in docs/scale.md)."""
    from distinit.broadcast._header import HEADER_BYTES

    out: dict[str, Any] = {"header_bytes": HEADER_BYTES, "scales": []}
    try:
        from distinit.doctor._reach import reach_plan

        plan: Callable[[int], list[list[int]]] | None = reach_plan
    except ImportError:
        plan = None
    for n in SCALES:
        hosts = n // 8
        row: dict[str, Any] = {
            "ranks": n,
            "hosts_at_8_per_host": hosts,
            "header_all_to_all_bytes_per_rank": n * HEADER_BYTES,
            "header_all_to_all_bytes_total": n * n * HEADER_BYTES,
            "header_all_gather_bytes_per_rank": (n - 1) * HEADER_BYTES,
            "header_all_gather_steps": n - 1,
            "digest_all_reduce_bytes_per_rank": 2 * 32,
            "store_client_connections": n,
        }
        if plan is not None:
            started = time.perf_counter()
            pairs = sum(len(p) for p in plan(hosts))
            row["doctor_reach_pairs"] = pairs
            row["doctor_reach_plan_s"] = time.perf_counter() - started
        out["scales"].append(row)
    return out


# ----------------------------------------------------------------------------------------------- report
def _render_computed(computed: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    lines += [
        "",
        "## Computed at 1k / 10k / 100k ranks",
        "",
        "| ranks | header all-to-all bytes per rank per call | all ranks together | all_gather steps | "
        "doctor reach pairs (8 ranks per host) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in computed["scales"]:
        lines.append(
            f"| {r['ranks']:,} | {r['header_all_to_all_bytes_per_rank'] / 1e6:,.1f} MB | "
            f"{r['header_all_to_all_bytes_total'] / 1e9:,.0f} GB | {r['header_all_gather_steps']:,} | "
            f"{r.get('doctor_reach_pairs', 'n/a')} |"
        )
    return lines


def render(res: dict[str, Any]) -> str:
    lines = [
        "# Scale benchmark",
        "",
        f"`{res['machine_facts']['command']}` on {res['machine_facts']['cpus']} CPUs, "
        f"{res['machine_facts']['when']}, load average {res['machine_facts']['load_average_at_start']} at the "
        f"start and {res['machine_facts']['load_average_at_end']} at the end (1, 5, 15 min).",
        "",
        "## Join protocol, simulated ranks (threads) against one TCPStore",
        "",
        "| ranks | connect | connect p50 / max per client | connects > 1 s | join | errors | store keys per rank |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["join"]:
        lines.append(
            f"| {r['ranks']} | {r['connect_s']:.2f} s | {r['connect_p50_ms']:.0f} / {r['connect_max_ms']:.0f} ms | "
            f"{r['connects_over_1s']} | {r['join_s']:.2f} s | {r['errors']} | {r['keys_per_rank']:.2f} |"
        )
    rate = res.get("store_rate")
    if rate:
        lines += [
            "",
            f"One TCPStore served {rate['ops_per_s']:,.0f} set/check operations per second to "
            f"{rate['clients']} client threads (2 s).",
        ]
    e = res["env"]
    if e:
        lines += [
            "",
            "## Environment at 100,000 ranks",
            "",
            f"- `expand_hostlist` of {e['hostlist_100k_hosts']:,} hosts: {e['hostlist_100k_s'] * 1000:.0f} ms "
            "(median of 5)",
            f"- `env_from_scheduler`, Slurm rank {e['env_rank']:,} of {e['env_world_size']:,} (12,500 nodes x 8): "
            f"{e['env_100k_s'] * 1000:.1f} ms (median of 5); MASTER_ADDR resolved to {e['env_master_addr']}",
        ]
    if res["header"]:
        lines += [
            "",
            "## Broadcast header exchange against world size (gloo, minimum over rounds; median beside it)",
            "",
        ]
        cases = list(res["header"][0]["cases"])
        lines.append("| world | bytes each rank sends | " + " | ".join(cases) + " |")
        lines.append("|---:|---:|" + "---:|" * len(cases))
        for r in res["header"]:
            cells = [f"{r['cases'][c]['min'] * 1e3:.2f} ({r['cases'][c]['median'] * 1e3:.2f}) ms" for c in cases]
            lines.append(f"| {r['world']} | {r['bytes_sent_per_rank']:,} | " + " | ".join(cells) + " |")
    lines += _render_computed(res["computed"])
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="join up to 256, worlds 2 4 8, fewer rounds")
    parser.add_argument("--join", type=int, nargs="+", default=None)
    parser.add_argument("--worlds", type=int, nargs="+", default=None)
    parser.add_argument("--budget", type=float, default=30.0, help="stop the join sizes after one took this long")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="run only these parts")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from _common import load_average, machine_facts

    load_at_start = load_average()
    parts = set(args.parts)
    res: dict[str, Any] = {"join": [], "env": {}, "header": []}
    if "join" in parts:
        print("join ...", flush=True)
        # Above 1024 the threads of one process starve each other (one GIL, 2 vCPUs): pass --join 2048 to try.
        res["join"] = join_rows(args.join or ([64, 256] if args.quick else [64, 256, 1024]), args.budget)
    if "store" in parts:
        res["store_rate"] = rate = store_rate()
        print(f"  store: {rate['ops_per_s']:,.0f} ops/s from {rate['clients']} clients", flush=True)
    if "env" in parts:
        print("env ...", flush=True)
        res["env"] = env_rows()
    if "header" in parts:
        print("header ...", flush=True)
        worlds = args.worlds or ([2, 4, 8] if args.quick else [2, 4, 8, 16])
        res["header"] = header_rows(worlds, 5 if args.quick else 10)
    res["computed"] = computed()
    res["machine_facts"] = machine_facts(load_at_start=load_at_start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(res, indent=2) + "\n")  # the source of truth, first
    (args.out / "scale.md").write_text(render(res))
    print((args.out / "scale.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
