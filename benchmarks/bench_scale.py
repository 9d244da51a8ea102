"""How each capability grows with the world: measured on this machine where it can be simulated, bounded.

Run:  .venv/bin/python benchmarks/bench_scale.py [--quick] [--join 64 256 1024 2048 4096] [--processes 16]
      [--worlds 2 4 8 16]

1. init: the join protocol with N simulated ranks against one TCPStore hosted in this process as distinit's
   rank 0 hosts it. The ranks run as ``--processes`` worker processes (32 by default) of N/32 threads each,
   one TCPStore client per rank, so no more than N/32 ranks share one interpreter lock (``--nice`` lowers
   their priority below the store host's): connect time (and
   each connect's latency: a connect slower than 1 s is counted), join time from one common instant to
   the last rank's return (and when the ranks had entered), errors, store keys per rank, the load average
   after each size. Sizes stop early once one size took longer than ``--budget`` seconds.
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
import math
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
def _raise_fd_limit() -> None:
    """Thousands of store connections in one process: lift the soft limit on open files to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _sim_rank(rank: int, world: int, store: Any, port: int, go: threading.Event, out: dict[int, Any]) -> None:
    """One simulated rank: the join protocol of distinit (enter, then wait for the world) on its own client."""
    from distinit.init._join import Claimant, JoinProtocol

    protocol = JoinProtocol(
        store,
        namespace="bench/",
        rank=rank,
        world_size=world,
        master=f"127.0.0.1:{port}",
        hosting=False,  # the store lives in the parent process, as rank 0's does in its own
        claimant=Claimant(host="sim", pid=100000 + rank),
    )
    go.wait()
    entered = None
    try:
        generation = protocol.generation()
        protocol.enter(generation)
        entered = time.time()
        protocol.wait(generation, 60.0)
        out[rank] = (time.time(), None, entered)
    except BaseException as exc:  # counted and reported
        out[rank] = (time.time(), type(exc).__name__, entered)


def sim_worker(spec: dict[str, Any]) -> None:
    """A process of simulated ranks: connect one client per rank, report, wait for GO, join, report.

    Protocol on stdin/stdout: ``READY {json}`` after connecting, then ``GO <wall time>`` in, then
    ``RESULT {json}`` with each rank's finish time and error (if any).
    """
    import torch.distributed as dist

    # Imported here, before READY: imported by the rank threads after GO, distinit's modules (pydantic models,
    # ~0.3 s of CPU per process) made 32 processes on 2 cores enter ~5 s late at every size, 64 ranks included.
    import distinit.init._join  # noqa: F401

    _raise_fd_limit()
    # The store host has a CPU of its own in a real job; here it shares 2 cores with every simulated rank.
    # --nice N lets it go first (but then every other job on the machine goes before the ranks too).
    os.nice(spec.get("nice", 0))
    # Hundreds of threads wait for one interpreter lock here; each waiter wakes every switch interval (5 ms)
    # to ask for it. A longer interval keeps those wake-ups from eating the 2 cores the ranks need.
    sys.setswitchinterval(0.05)
    port, world, ranks = spec["port"], spec["world"], list(range(spec["first"], spec["last"]))

    def connect(_: int) -> tuple[Any, float]:
        began = time.monotonic()
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(60))
        return client, time.monotonic() - began

    began = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        made = list(pool.map(connect, ranks))
    print("READY " + json.dumps({"connect_s": time.monotonic() - began, "latencies": [t for _, t in made]}), flush=True)
    t0 = float(sys.stdin.readline().split()[1])
    go, out = threading.Event(), {}
    threads = [
        threading.Thread(target=_sim_rank, args=(r, world, c, port, go, out), daemon=True)
        for r, (c, _) in zip(ranks, made, strict=True)
    ]
    for t in threads:
        t.start()
    time.sleep(max(0.0, t0 - time.time()))
    go.set()
    for t in threads:
        t.join(max(0.1, t0 + 90 - time.time()))  # each rank waits at most 60 s
    done = {r: out.get(r, (time.time(), "stuck", None)) for r in ranks}
    result = {"done": [d[0] for d in done.values()], "errors": [d[1] for d in done.values()]}
    result["entered"] = [d[2] for d in done.values()]
    print("RESULT " + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # thousands of client and heartbeat threads: skip their teardown


def _start_workers(n: int, processes: int, port: int, nice: int) -> list[Any]:
    import subprocess

    per = -(-n // processes)
    workers = []
    for first in range(0, n, per):
        spec = {"port": port, "world": n, "first": first, "last": min(n, first + per), "nice": nice}
        workers.append(
            subprocess.Popen(
                [sys.executable, __file__, "--sim-worker", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
            )
        )
    return workers


def _read(worker: Any, tag: str, timeout: float) -> dict[str, Any]:
    import select

    ready, _, _ = select.select([worker.stdout], [], [], timeout)
    line = worker.stdout.readline() if ready else ""
    if not line.startswith(tag + " "):
        raise RuntimeError(f"simulation worker {worker.pid} sent {line[:200]!r}, not {tag}")
    return dict(json.loads(line[len(tag) + 1 :]))


def join_row(n: int, processes: int, nice: int = 0) -> dict[str, Any]:
    """``n`` simulated ranks as ``processes`` processes of threads (one client each) against one store.

    The store is hosted the way distinit's rank 0 hosts it (:func:`distinit.init._store.host_store`) in this
    process; connect time is each worker process's own (they connect in parallel after their imports);
    join time runs from one common start instant to the last rank's return.
    """
    from distinit.init._store import host_store

    _raise_fd_limit()
    server = host_store("127.0.0.1", 0, timeout=120)
    workers = _start_workers(n, processes, server.port, nice)
    try:
        ready = [_read(w, "READY", 300) for w in workers]
        t0 = time.time() + 1.0
        for w in workers:
            w.stdin.write(f"GO {t0}\n")
            w.stdin.flush()
        results = [_read(w, "RESULT", 120) for w in workers]
        keys = server.num_keys()
    finally:
        for w in workers:
            w.kill()
            w.wait(30)
    latencies = sorted(t for r in ready for t in r["latencies"])
    finished = sorted(t - t0 for r in results for t in r["done"])
    errors = [e for r in results for e in r["errors"] if e]
    entered = sorted(t - t0 for r in results for t in r["entered"] if t is not None)
    return {
        "ranks": n,
        "processes": len(workers),
        "threads_per_process": -(-n // len(workers)),
        "connect_s": max(r["connect_s"] for r in ready),
        "connect_p50_ms": 1000 * latencies[len(latencies) // 2],
        "connect_max_ms": 1000 * latencies[-1],
        "connects_over_1s": sum(t > 1.0 for t in latencies),
        "join_s": finished[-1],
        "join_p50_s": finished[len(finished) // 2],
        "entered_p50_s": entered[len(entered) // 2] if entered else None,
        "entered_max_s": entered[-1] if entered else None,
        "entered_by_process_max_s": [
            round(max((t - t0 for t in r["entered"] if t is not None), default=-1.0), 3) for r in results
        ],
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "store_keys": keys,
        "keys_per_rank": keys / n,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def join_rows(sizes: list[int], budget: float, processes: int, nice: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        row = join_row(n, min(processes, n), nice)
        rows.append(row)
        print(
            f"  join {n} ({row['processes']} x {row['threads_per_process']}): connect {row['connect_s']:.2f} s "
            f"({row['connects_over_1s']} over 1 s), join {row['join_s']:.2f} s (p50 {row['join_p50_s']:.2f} s), "
            f"errors {row['errors']} {row['error_kinds']}, load {row['load_average_after']}",
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
    from distinit._hostlist import expand_hostlist
    from distinit.env import env_from_scheduler

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
    from distinit.broadcast import _digest, _header, broadcast_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        row = _header.HEADER_WORDS
        rows_in, rows_out = torch.zeros(world * row, dtype=torch.int64), torch.empty(world * row, dtype=torch.int64)
        gathered = torch.empty(world * row, dtype=torch.int64)
        one_row, small = torch.zeros(row, dtype=torch.int64), torch.zeros(256)
        digest = torch.zeros(_digest.DIGEST_WORDS, dtype=torch.int64)
        tiny = torch.arange(16.0) if rank == 0 else None  # 64 B: inline in the header on both paths
        real_threshold = _digest.digest_from

        def checked_call(threshold: int) -> Callable[[], Any]:
            # Which path a call takes is decided from the group size and this threshold on every call,
            # so switching it between interleaved rounds (on every rank alike) compares the two paths
            # in the same group, on the same load.
            def call() -> Any:
                _digest.digest_from = lambda: threshold  # type: ignore[assignment]
                return broadcast_tensor(tiny)

            return call

        max_op = dist.ReduceOp.MAX
        result = compare(
            {
                "raw broadcast, 1 KB": lambda: dist.broadcast(small, 0),
                f"header all-to-all ({_header.HEADER_BYTES} B rows)": lambda: dist.all_to_all_single(rows_out, rows_in),
                f"all_gather of the same {_header.HEADER_BYTES} B row": lambda: dist.all_gather_into_tensor(
                    gathered, one_row
                ),
                f"digest all_reduce ({_digest.DIGEST_BYTES} B, MAX; a ring on gloo)": lambda: dist.all_reduce(
                    digest, op=max_op
                ),
                "digest tree (sends + broadcast, as used)": lambda: _digest.tree_max(
                    digest, group=dist.group.WORLD, rank=rank, group_size=world, wait_for=None
                ),
                "broadcast_tensor 64 B, row path": checked_call(1 << 31),
                "broadcast_tensor 64 B, digest path": checked_call(1),
            },
            reps,
            inner=5,
            warmup=3,
        )
        _digest.digest_from = real_threshold  # type: ignore[assignment]
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
    from distinit.broadcast._digest import DIGEST_BYTES, DIGEST_FROM
    from distinit.broadcast._header import HEADER_BYTES

    out: dict[str, Any] = {"header_bytes": HEADER_BYTES, "digest_bytes": DIGEST_BYTES, "scales": []}
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
            # From DIGEST_FROM ranks the checked call sends one digest per step of a tree reduce + broadcast.
            "digest_path": n >= DIGEST_FROM,
            "digest_bytes_per_step": DIGEST_BYTES,
            "digest_steps_gloo": 2 * math.ceil(math.log2(n)),
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
        "| ranks | rows (all-to-all) bytes per rank per call, had the rows been kept | all ranks together | "
        "all_gather steps | what distinit sends: digest steps on gloo x bytes | doctor reach pairs (8 per host) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in computed["scales"]:
        digest = f"{r['digest_steps_gloo']} x {r['digest_bytes_per_step']:,} B" if r.get("digest_path") else "rows"
        lines.append(
            f"| {r['ranks']:,} | {r['header_all_to_all_bytes_per_rank'] / 1e6:,.1f} MB | "
            f"{r['header_all_to_all_bytes_total'] / 1e9:,.0f} GB | {r['header_all_gather_steps']:,} | {digest} | "
            f"{r.get('doctor_reach_pairs', 'n/a')} |"
        )
    return lines


def _join_facts(res: dict[str, Any]) -> list[str]:
    """When the join rows come from a later run (``--parts join``) than the rest: that run's command and load."""
    facts = res.get("join_machine_facts")
    if not facts:
        return []
    return [
        f"These rows: `{facts['command']}`, {facts['when']}, load average {facts.get('load_average_at_start')} "
        f"at the start and {facts['load_average_at_end']} at the end.",
        "",
    ]


def render(res: dict[str, Any]) -> str:
    lines = [
        "# Scale benchmark",
        "",
        f"`{res['machine_facts']['command']}` on {res['machine_facts']['cpus']} CPUs, "
        f"{res['machine_facts']['when']}, load average {res['machine_facts']['load_average_at_start']} at the "
        f"start and {res['machine_facts']['load_average_at_end']} at the end (1, 5, 15 min).",
        "",
        "## Join protocol, simulated ranks (processes of threads) against one TCPStore",
        "",
        *_join_facts(res),
        "| ranks | processes x threads | connect | connect p50 / max per client | connects > 1 s | all entered | "
        "join (p50 / last) | errors | store keys per rank | load after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["join"]:
        entered = f"{r['entered_max_s']:.2f} s" if r.get("entered_max_s") is not None else "n/a"
        kinds = f" ({', '.join(r['error_kinds'])})" if r["error_kinds"] else ""
        lines.append(
            f"| {r['ranks']} | {r.get('processes', 1)} x {r.get('threads_per_process', r['ranks'])} | "
            f"{r['connect_s']:.2f} s | {r['connect_p50_ms']:.0f} / {r['connect_max_ms']:.0f} ms | "
            f"{r['connects_over_1s']} | {entered} | {r.get('join_p50_s', r['join_s']):.2f} / {r['join_s']:.2f} s | "
            f"{r['errors']}{kinds} | {r['keys_per_rank']:.2f} | {r.get('load_average_after', '')} |"
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
    parser.add_argument("--processes", type=int, default=32, help="simulated ranks run as this many processes")
    parser.add_argument("--nice", type=int, default=0, help="niceness of the simulated ranks (the store's is 0)")
    parser.add_argument("--sim-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sim_worker:
        sim_worker(json.loads(args.sim_worker))
        return 0
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from _common import load_average, machine_facts

    load_at_start = load_average()
    parts = set(args.parts)
    res: dict[str, Any] = {"join": [], "env": {}, "header": []}
    if "join" in parts:
        print("join ...", flush=True)
        sizes = args.join or ([64, 256] if args.quick else [64, 256, 1024, 2048, 4096])
        res["join"] = join_rows(sizes, args.budget, args.processes, args.nice)
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
