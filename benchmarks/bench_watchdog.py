"""Benchmark: distinit.watchdog against torch's FileTimerServer/FileTimerClient, side by side in one run.

Three measurements, each run for both implementations on this machine in this run:

1. arm+disarm cost of one ``with expires(...)`` region (explicit scope, default scope, tight and spaced 1 ms);
2. 100 clients x 10 000 unpaced arms against one server: calls that raised, and arms lost (distinit: arms
   missing from the server's view of each client's table; torch: messages that never reached the server);
3. deadline -> stack dumped -> process dead, per trial (p50/p99/max), for a sleeping worker with grace 0,
   a worker holding the GIL in C, and a SIGTERM-ignoring worker with grace 0.5 s; torch at
   ``max_interval=0.1`` (torchrun's value) and at its class default 10 s.

Usage: ``python benchmarks/bench_watchdog.py [--clients 100] [--arms 10000] [--trials 30] [--quick]``.
Prints a table and writes ``benchmarks/results/watchdog.{md,json}``. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
import os
import platform
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
FORK = mp.get_context("fork")  # children inherit the imports: 100 torch imports would swamp 2 cores
LONG = 3600.0  # deadlines that never expire during the cost and load runs
QUANTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


# ----------------------------------------------------------------------------- 1. arm+disarm cost
def _time_regions(region: Callable[[], Any], n: int, spaced: int) -> dict[str, float]:
    """Time ``n`` regions one by one, ``n`` in a tight loop and ``spaced`` 1 ms apart; count calls that raised."""
    errors = 0

    def once() -> float | None:
        nonlocal errors
        t0 = time.perf_counter_ns()
        try:
            with region():
                pass
        except Exception:  # torch: BlockingIOError once the FIFO is full
            errors += 1
            return None
        return (time.perf_counter_ns() - t0) / 1000

    for _ in range(1000):  # warm up
        once()
    errors = 0
    samples = [x for x in (once() for _ in range(n)) if x is not None]
    t0 = time.perf_counter_ns()
    for _ in range(n):
        try:
            with region():
                pass
        except Exception:
            errors += 1
    tight_mean = (time.perf_counter_ns() - t0) / 1000 / n
    spaced_samples = []
    for _ in range(spaced):
        time.sleep(0.001)
        x = once()
        if x is not None:
            spaced_samples.append(x)
    return {
        "p50_us": statistics.median(samples) if samples else float("nan"),
        "p99_us": pct(samples, 99) if samples else float("nan"),
        "tight_mean_us": tight_mean,
        "spaced_p50_us": statistics.median(spaced_samples) if spaced_samples else float("nan"),
        "spaced_p99_us": pct(spaced_samples, 99) if spaced_samples else float("nan"),
        "errors": errors,
        "calls": 2 * n + spaced,
        # the distribution, for the plot: percentiles 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9
        "quantiles_us": {str(q): pct(samples, q) for q in QUANTILES} if samples else {},
        "spaced_quantiles_us": {str(q): pct(spaced_samples, q) for q in QUANTILES} if spaced_samples else {},
    }


def _cost_child(impl: str, path: str, n: int, spaced: int, conn: Connection) -> None:
    logging.disable(logging.CRITICAL)
    if impl == "distinit":
        from distinit.watchdog import WatchdogClient

        client = WatchdogClient(path)
        assert client.registered, client.reason
        out = {
            "explicit": _time_regions(lambda: client.expires(LONG, scope="step"), n, spaced),
            "default": _time_regions(lambda: client.expires(LONG), n, spaced),
            "empty": _time_regions(contextlib.nullcontext, n, spaced),  # the floor of this measurement
        }
    elif impl in ("dropin", "dropin_torch"):  # the drop-in client, under distinit's server or torch's
        from distinit.watchdog import elastic

        dclient = elastic.FileTimerClient(path)
        out = {
            "explicit": _time_regions(lambda: elastic.expires(after=LONG, scope="step", client=dclient), n, spaced),
            "default": _time_regions(lambda: elastic.expires(after=LONG, client=dclient), n, spaced),
        }
    else:
        from torch.distributed.elastic.timer import FileTimerClient, expires

        tclient = FileTimerClient(path)
        out = {
            "explicit": _time_regions(lambda: expires(after=LONG, scope="step", client=tclient), n, spaced),
            "default": _time_regions(lambda: expires(after=LONG, client=tclient), n // 10, spaced // 4),
        }
    conn.send(out)


def _run_child(target: Callable[..., None], *args: Any, timeout: float = 600) -> Any:
    parent, child = FORK.Pipe(duplex=False)
    proc = FORK.Process(target=target, args=(*args, child))
    proc.start()
    deadline = time.monotonic() + timeout
    while not parent.poll(0.5):
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{target.__name__}{args[:2]} failed (exit {proc.exitcode}) or timed out")
    result = parent.recv()
    proc.join(30)
    return result


def bench_cost(n: int, spaced: int, impls: tuple[str, ...] = ("distinit", "torch")) -> dict[str, Any]:
    """The region cost of each of ``impls`` (``distinit``: the native arm, ``dropin``, ``torch``), in turn.

    ``dropin_torch`` is the drop-in client under torch's server (it opens and closes the FIFO per request).

    Each client runs in a forked child while its own kind of server (started here) serves it.
    """
    from torch.distributed.elastic.timer import FileTimerServer as TorchServer

    from distinit.watchdog import WatchdogServer
    from distinit.watchdog.elastic import FileTimerServer

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wdb", dir="/dev/shm") as tmp:
        for impl in impls:
            path = os.path.join(tmp, impl)
            server: Any = (
                WatchdogServer(path, grace=0)
                if impl == "distinit"
                else (FileTimerServer if impl == "dropin" else TorchServer)(path, "bench", max_interval=0.1)
            )
            server.start()
            try:
                out[impl] = _run_child(_cost_child, impl, path, n, spaced)
            finally:
                server.stop()
    return out


# ----------------------------------------------------------------------------- 2. load
def _load_child(impl: str, path: str, arms: int, go: Any, leave: Any, conn: Connection) -> None:
    logging.disable(logging.CRITICAL)
    if impl == "distinit":
        from distinit.watchdog import WatchdogClient

        client = WatchdogClient(path)

        def region() -> Any:
            return client.expires(LONG, scope="load")
    else:
        from torch.distributed.elastic.timer import FileTimerClient, expires

        tclient = FileTimerClient(path)

        def region() -> Any:
            return expires(after=LONG, scope="load", client=tclient)

    go.wait()
    errors, worst = 0, 0.0
    began = time.perf_counter()
    for _ in range(arms):
        t0 = time.perf_counter()
        try:
            with region():
                pass
        except Exception:
            errors += 1
        worst = max(worst, time.perf_counter() - t0)
    from distinit.watchdog._proc import start_time

    conn.send(
        {
            "pid": os.getpid(),
            "start": start_time(os.getpid()),
            "errors": errors,
            "worst_s": worst,
            "elapsed_s": time.perf_counter() - began,
        }
    )
    leave.wait(600)


def _run_load(impl: str, path: str, clients: int, arms: int, inspect: Callable[[list[dict[str, Any]]], Any]) -> Any:
    go, leave = FORK.Event(), FORK.Event()
    pipes, procs = [], []
    for _ in range(clients):
        parent, child = FORK.Pipe(duplex=False)
        proc = FORK.Process(target=_load_child, args=(impl, path, arms, go, leave, child))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    time.sleep(1.0 + clients * 0.02)  # let every client register before the start signal
    began = time.perf_counter()
    go.set()
    reports = []
    for parent in pipes:
        if not parent.poll(900):
            raise RuntimeError(f"{impl} load client produced nothing in 900 s")
        reports.append(parent.recv())
    wall = time.perf_counter() - began
    extra = inspect(reports)
    leave.set()
    for proc in procs:
        proc.join(30)
    return reports, wall, extra


def bench_load(clients: int, arms: int) -> dict[str, Any]:
    from torch.distributed.elastic.timer import FileTimerServer

    from distinit.watchdog import WatchdogServer, _slots

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wdb", dir="/dev/shm") as tmp:
        path = os.path.join(tmp, "wd")

        def seen_by_server(reports: list[dict[str, Any]]) -> dict[str, int]:
            counted, armed_left = 0, 0
            for r in reports:
                table = _slots.TableReader(
                    os.path.join(path, _slots.slot_file_name(r["pid"], r["start"])), os.geteuid()
                )
                counted += table.arms
                armed_left += len(table.armed())
                table.close()
            return {"arms_seen": counted, "left_armed": armed_left}

        with WatchdogServer(path, grace=0) as server:
            reports, wall, seen = _run_load("distinit", path, clients, arms, seen_by_server)
            registered = len(server.worker_pids())
        total = clients * arms
        out["distinit"] = {
            "calls": total,
            "errors": sum(r["errors"] for r in reports),
            "lost": total - seen["arms_seen"] + seen["left_armed"],
            "registered": registered,
            "worst_call_s": max(r["worst_s"] for r in reports),
            "wall_s": wall,
            "detail": f"server view: {seen['arms_seen']} arms counted, {seen['left_armed']} left armed",
        }

        fifo = os.path.join(tmp, "fifo")
        server_t = FileTimerServer(fifo, "bench", max_interval=0.1)
        received = [0]
        original = server_t.register_timers

        def counting(requests: list[Any]) -> None:
            received[0] += len(requests)
            original(requests)

        server_t.register_timers = counting  # type: ignore[method-assign]
        server_t.start()
        try:
            reports, wall, _ = _run_load("torch", fifo, clients, arms, lambda reports: None)
            time.sleep(1.0)  # let the server drain what reached the pipe
        finally:
            server_t.stop()
        out["torch"] = {
            "calls": total,
            "errors": sum(r["errors"] for r in reports),
            "lost": 2 * total - received[0],
            "worst_call_s": max(r["worst_s"] for r in reports),
            "wall_s": wall,
            "detail": f"server received {received[0]} of {2 * total} acquire/release messages",
        }
    return out


# ----------------------------------------------------------------------------- 3. deadline -> dead
OURS_WORKER = """
import signal, sys, time
from distinit.watchdog import WatchdogClient
mode, after = sys.argv[1], float(sys.argv[2])
client = WatchdogClient()
assert client.registered, client.reason
if mode == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with client.expires(after, scope="bench"):
    print(time.monotonic() + after, flush=True)
    if mode == "gil":
        sum(range(10**14))
    time.sleep(600)
"""

TORCH_WORKER = """
import sys, time
from torch.distributed.elastic.timer import FileTimerClient, expires
after = float(sys.argv[2])
client = FileTimerClient(sys.argv[1])
with expires(after=after, scope="bench", client=client):
    print(time.monotonic() + after, flush=True)
    time.sleep(600)
"""

TORCH_TIMER = "torch.distributed.elastic.timer"

DROPIN_SERVER = """
import sys, time
from distinit.watchdog.elastic import FileTimerServer
server = FileTimerServer(sys.argv[1], "bench", max_interval=float(sys.argv[2]), events=sys.argv[3])
server.start()
print("ready", flush=True)
time.sleep(600)
"""

TORCH_SERVER = """
import sys, time
from torch.distributed.elastic.timer import FileTimerServer
server = FileTimerServer(sys.argv[1], "bench", max_interval=float(sys.argv[2]))
server.start()
print("ready", flush=True)
time.sleep(600)
"""


def _wait_dead(proc: subprocess.Popen[str], timeout: float) -> float:
    """Monotonic time at which ``proc`` exited (pidfd poll)."""
    fd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(int(timeout * 1000)):
            proc.kill()
            raise RuntimeError(f"worker {proc.pid} still alive after {timeout} s")
        return time.monotonic()
    finally:
        os.close(fd)
        proc.wait(10)


def _wait_lines(path: str, n: int, timeout: float) -> None:
    """Wait until the file ``path`` has ``n`` lines (the server writes its event after the signal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), open(path) as fh:
            if sum(1 for _ in fh) >= n:
                return
        time.sleep(0.01)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    if not select.select([proc.stdout], [], [], timeout)[0]:
        proc.kill()
        raise RuntimeError(f"process {proc.pid} printed nothing in {timeout} s")
    return proc.stdout.readline().strip()


def latency_ours(mode: str, grace: float, trials: int) -> dict[str, Any]:
    from distinit.watchdog import WatchdogEvent, WatchdogServer

    events: dict[int, WatchdogEvent] = {}
    lat, noticed, dumped, outcomes = [], [], 0, []
    with (
        tempfile.TemporaryDirectory(prefix="wdb", dir="/dev/shm") as tmp,
        WatchdogServer(
            os.path.join(tmp, "wd"), grace=grace, on_expire=lambda ev: events.__setitem__(ev.pid or 0, ev)
        ) as server,
    ):
        for _ in range(trials):
            after = random.uniform(0.3, 0.6)  # randomised: fixed deadlines phase-lock to the server's wakeups
            proc = subprocess.Popen(
                [sys.executable, "-c", OURS_WORKER, mode, str(after)],
                env={**os.environ, **server.env()},
                stdout=subprocess.PIPE,
                text=True,
            )
            _readline(proc, 60)
            dead = _wait_dead(proc, 60)
            deadline = time.monotonic() + 10
            while proc.pid not in events and time.monotonic() < deadline:
                time.sleep(0.005)
            ev = events[proc.pid]
            assert ev.deadline is not None
            lat.append((dead - ev.deadline) * 1000)
            noticed.append((ev.overshoot_s or 0.0) * 1000)
            dumped += bool(ev.stack)
            outcomes.append(ev.outcome)
            assert proc.stdout is not None
            proc.stdout.close()
    return {
        "trials": trials,
        "p50_ms": statistics.median(lat),
        "p99_ms": pct(lat, 99),
        "max_ms": max(lat),
        "min_ms": min(lat),
        "stacks_dumped": dumped,
        "killed": outcomes.count("killed"),
        "noticed_p50_ms": statistics.median(noticed),
        "noticed_p99_ms": pct(noticed, 99),
        "load_avg_1m": os.getloadavg()[0],
        "lat_ms": [round(x, 2) for x in lat],
    }


def latency_torch(max_interval: float, trials: int, module: str = TORCH_TIMER) -> dict[str, Any]:
    """Hang -> death of a FileTimer worker under ``module``'s server (torch's, or the drop-in with the same code)."""
    dropin = module != TORCH_TIMER
    lat, server_died = [], 0
    with tempfile.TemporaryDirectory(prefix="wdb", dir="/dev/shm") as tmp:
        for i in range(trials):
            fifo = os.path.join(tmp, f"fifo{i}")
            script, extra = (DROPIN_SERVER, [os.path.join(tmp, "events.jsonl")]) if dropin else (TORCH_SERVER, [])
            server = subprocess.Popen(
                [sys.executable, "-c", script, fifo, str(max_interval), *extra],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            _readline(server, 60)
            after = random.uniform(0.3, 0.6)
            proc = subprocess.Popen(
                [sys.executable, "-c", TORCH_WORKER.replace(TORCH_TIMER, module), fifo, str(after)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            deadline = float(_readline(proc, 60))
            lat.append((_wait_dead(proc, 60) - deadline) * 1000)
            try:
                if dropin:  # it never signals itself: still running, stopped once its event is written
                    _wait_lines(extra[0], i + 1, 10)
                    server_died += server.poll() is not None
                    server.terminate()
                    server.wait(10)
                    continue
                server_died += server.wait(max_interval + 5) != 0  # it kills itself after a reap
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
            finally:
                for p in (proc, server):
                    if p.stdout is not None:
                        p.stdout.close()
        stacks = 0
        if dropin:
            with open(os.path.join(tmp, "events.jsonl")) as fh:
                stacks = sum(1 for line in fh if json.loads(line).get("stack"))
    return {
        "trials": trials,
        "p50_ms": statistics.median(lat),
        "p99_ms": pct(lat, 99),
        "max_ms": max(lat),
        "min_ms": min(lat),
        "stacks_dumped": stacks,
        "server_killed_itself": server_died,
        "load_avg_1m": os.getloadavg()[0],
        "lat_ms": [round(x, 2) for x in lat],
    }


# ----------------------------------------------------------------------------- 4. the FileTimer drop-in
def bench_drop_in(n: int, spaced: int, trials: int) -> dict[str, Any]:
    """distinit.watchdog.elastic beside torch's FileTimer and the native arm, in one run.

    Cost: one ``expires(after, scope, client)`` region (acquire + release) with each implementation's own
    server running. Latency: hang -> death under each FileTimer server at torchrun's ``max_interval=0.1``,
    and under the drop-in at torch's class default 10 s (it notices expiries at their deadline anyway).
    """
    cost = bench_cost(n, spaced, ("distinit", "dropin", "dropin_torch", "torch"))
    latency = {
        "dropin_0.1": latency_torch(0.1, trials, "distinit.watchdog.elastic"),
        "torch_0.1": latency_torch(0.1, trials),
        "dropin_10": latency_torch(10.0, max(3, trials // 3), "distinit.watchdog.elastic"),
    }
    return {"cost": cost, "latency": latency, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def render_drop_in(d: dict[str, Any]) -> str:
    """The drop-in's section of ``watchdog.md``."""
    c, lt = d["cost"], d["latency"]

    def cost(impl: str) -> str:
        e = c[impl]["explicit"]
        return f"{e['p50_us']:.2f} µs ({e['p99_us']:.1f}); raised {e['errors']} of {e['calls']}"

    def lat(key: str) -> str:
        t = lt[key]
        return (
            f"{t['p50_ms']:.0f} / {t['p99_ms']:.0f} / {t['max_ms']:.0f} ms (n={t['trials']}, stacks "
            f"{t['stacks_dumped']}, server killed itself {t['server_killed_itself']}/{t['trials']})"
        )

    rows = [
        "| measurement | distinit.watchdog.elastic (drop-in) | torch FileTimer | native distinit.watchdog |",
        "|---|---|---|---|",
        f"| `expires(after, scope, client)`: acquire+release, p50 (p99) | {cost('dropin')} | {cost('torch')} | "
        f"{cost('distinit')} (arm+disarm) |",
        f"| same, the drop-in client under torch's server | {cost('dropin_torch')} | | |",
        f"| same, default scope, p50 | {c['dropin']['default']['p50_us']:.2f} µs | "
        f"{c['torch']['default']['p50_us']:.0f} µs | {c['distinit']['default']['p50_us']:.2f} µs |",
        f"| hang → death, max_interval 0.1 s: p50 / p99 / max | {lat('dropin_0.1')} | {lat('torch_0.1')} | see above |",
        f"| same, max_interval 10 s (torch's class default) | {lat('dropin_10')} | 9.6 / 9.7 s (table above) | |",
    ]
    return (
        f"\n\n## FileTimer drop-in (`distinit.watchdog.elastic`)\n\n"
        f"`python benchmarks/bench_watchdog.py --drop-in-only`, {d['when']}, same machine (these rows only; the "
        "rows above are from the full run).\n\n"
        + "\n".join(rows)
        + "\n\nNotes: the same worker code for both FileTimers (`expires(after=...)` then sleep), its server in "
        "another process. The drop-in's worker installs the dump handler, so its latency includes the stack dump "
        "(bounded by 0.1 s). The drop-in keeps the FIFO open and writes one line per call under distinit's server "
        "(its marker names the FIFO); under torch's it opens, writes and closes the FIFO per call, as torch does "
        "(torch's server reaps only once every writer has closed it); torch raises `BlockingIOError` once it is "
        "full.\n"
    )


# ----------------------------------------------------------------------------- report
def machine() -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "note": "2 vCPUs shared with other jobs: absolute timings are indicative",
    }


def render(res: dict[str, Any]) -> str:
    c, ld, lt = res["cost"], res["load"], res["latency"]
    rows = [
        "| measurement | distinit.watchdog | torch FileTimer | target |",
        "|---|---|---|---|",
        f"| arm+disarm, explicit scope, p50 (p99) | {c['distinit']['explicit']['p50_us']:.2f} µs "
        f"({c['distinit']['explicit']['p99_us']:.1f}) | {c['torch']['explicit']['p50_us']:.1f} µs "
        f"({c['torch']['explicit']['p99_us']:.0f}) | ≤ 5 µs |",
        f"| same, tight-loop mean | {c['distinit']['explicit']['tight_mean_us']:.2f} µs | "
        f"{c['torch']['explicit']['tight_mean_us']:.1f} µs | |",
        f"| same, spaced 1 ms, p50 (p99) | {c['distinit']['explicit']['spaced_p50_us']:.2f} µs "
        f"({c['distinit']['explicit']['spaced_p99_us']:.1f}) | {c['torch']['explicit']['spaced_p50_us']:.1f} µs "
        f"({c['torch']['explicit']['spaced_p99_us']:.0f}) | |",
        f"| floor: an empty `with nullcontext()`, p50 tight / spaced 1 ms | "
        f"{c['distinit']['empty']['p50_us']:.2f} / {c['distinit']['empty']['spaced_p50_us']:.2f} µs | | |",
        f"| arm+disarm, default scope, p50 | {c['distinit']['default']['p50_us']:.2f} µs | "
        f"{c['torch']['default']['p50_us']:.0f} µs | |",
        f"| single client: calls that raised | {c['distinit']['explicit']['errors']} of "
        f"{c['distinit']['explicit']['calls']} | {c['torch']['explicit']['errors']} of "
        f"{c['torch']['explicit']['calls']} | 0 |",
        f"| {res['args']['clients']} clients × {res['args']['arms']} arms: calls that raised | "
        f"{ld['distinit']['errors']} | {ld['torch']['errors']} | 0 |",
        f"| same: lost | {ld['distinit']['lost']} | {ld['torch']['lost']} messages | 0 |",
        f"| same: worst single call | {ld['distinit']['worst_call_s'] * 1000:.1f} ms | "
        f"{ld['torch']['worst_call_s'] * 1000:.0f} ms | |",
    ]
    names = {
        "sleep_grace0": "deadline → dumped → dead, sleeping worker, grace 0",
        "gil_grace0": "same, worker holding the GIL in C, grace 0",
        "ignore_term_grace05": "same, SIGTERM-ignoring worker, grace 0.5 s",
    }
    torch_rows = {"sleep_grace0": lt.get("torch_0.1"), "gil_grace0": None, "ignore_term_grace05": None}
    for key, label in names.items():
        ours = lt[key]
        target = "≤ 600 ms (100 ms + grace)" if key == "ignore_term_grace05" else "≤ 100 ms"
        t = torch_rows[key]
        theirs = (
            f"{t['p50_ms']:.0f} / {t['p99_ms']:.0f} / {t['max_ms']:.0f} ms, no stack "
            f"(max_interval 0.1; server killed itself {t['server_killed_itself']}/{t['trials']})"
            if t
            else "no stack dump; no escalation"
        )
        rows.append(
            f"| {label}: p50 / p99 / max (n={ours['trials']}, stacks {ours['stacks_dumped']}) | "
            f"{ours['p50_ms']:.0f} / {ours['p99_ms']:.0f} / {ours['max_ms']:.0f} ms (noticed "
            f"{ours.get('noticed_p50_ms', float('nan')):.0f} / {ours.get('noticed_p99_ms', float('nan')):.0f} ms "
            f"late; load {ours.get('load_avg_1m', float('nan')):.1f}) | {theirs} | {target} |"
        )
    if "torch_10" in lt:
        t = lt["torch_10"]
        rows.append(
            f"| torch at its default max_interval=10 s: p50 / max (n={t['trials']}) | — | "
            f"{t['p50_ms'] / 1000:.1f} / {t['max_ms'] / 1000:.1f} s | |"
        )
    m = res["machine"]
    head = (
        f"# Watchdog benchmark\n\n`python benchmarks/bench_watchdog.py` on {m['cpus']} CPUs, kernel {m['kernel']}, "
        f"Python {m['python']}, torch {m['torch']}, {res['when']}. {m['note']}.\n\n"
    )
    notes = (
        "\n\nNotes: cost is one `with expires(...)` region (arm + disarm), timed one by one with "
        "`perf_counter_ns` (its ~0.1 µs overhead included) in a forked client registered with a live server. "
        "`lost` for distinit counts arms missing from the server's view of each client's shared table plus "
        "regions left armed; for torch, acquire/release messages the server never received. Latency is from the "
        "deadline (CLOCK_MONOTONIC) to the moment the parent's pidfd reported the worker dead; distinit's "
        "includes the faulthandler stack dump; `noticed` is when the server saw the expiry (its 20 ms "
        "resolution) and `load` the 1-minute load average at the end of the trials (2 CPUs). "
        "Spaced calls run on a cold CPU after each 1 ms sleep (see the "
        "empty-block floor), which is closer to one region per training step. "
        "Worker deadlines are randomised in [0.3, 0.6] s; with n ≤ 60 "
        "the p99 is the largest or second-largest trial. The worst single call under load is the OS "
        "scheduler, not the watchdog: 100 busy processes share 2 cores and a distinit arm makes no system "
        "call, while torch's worst calls include its 0.1 s open retries.\n"
    )
    return head + "\n".join(rows) + notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--arms", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--torch-trials", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="skip torch at max_interval=10 s (~40 s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--drop-in-only",
        action="store_true",
        help="measure only the FileTimer drop-in rows and merge them into the existing results",
    )
    args = parser.parse_args()
    if args.drop_in_only:
        return _drop_in_only(args)
    logging.disable(logging.CRITICAL)  # torch's client logs ten tracebacks per failed open; ours one per kill
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    res: dict[str, Any] = {
        "args": vars(args) | {"out": str(args.out)},
        "machine": machine(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print("cost ...", flush=True)
    res["cost"] = bench_cost(20_000, 1000)
    print(f"load {args.clients} x {args.arms} ...", flush=True)
    res["load"] = bench_load(args.clients, args.arms)
    print("latency ...", flush=True)
    res["latency"] = {
        "sleep_grace0": latency_ours("sleep", 0.0, args.trials),
        "gil_grace0": latency_ours("gil", 0.0, max(5, args.trials // 3)),
        "ignore_term_grace05": latency_ours("ignore_term", 0.5, max(5, args.trials // 3)),
        "torch_0.1": latency_torch(0.1, args.torch_trials),
    }
    if not args.quick:
        res["latency"]["torch_10"] = latency_torch(10.0, 3)
    from _common import machine_facts

    res["machine_facts"] = machine_facts(load_at_start=load_at_start)
    res["drop_in"] = bench_drop_in(20_000, 1000, args.torch_trials)
    table = render(res) + render_drop_in(res["drop_in"])
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watchdog.md").write_text(table)
    (args.out / "watchdog.json").write_text(json.dumps(res, indent=2) + "\n")
    ours = res["latency"]
    ok = (
        res["cost"]["distinit"]["explicit"]["p50_us"] <= 5
        and res["load"]["distinit"]["errors"] == 0
        and res["load"]["distinit"]["lost"] == 0
        and ours["sleep_grace0"]["p99_ms"] <= 100
        and ours["ignore_term_grace05"]["p99_ms"] <= 600
    )
    print("targets met" if ok else "TARGETS MISSED", flush=True)
    return 0 if ok else 1


def _drop_in_only(args: argparse.Namespace) -> int:
    """Re-measure the drop-in rows only (a loaded machine: the full run takes minutes) and merge them."""
    logging.disable(logging.CRITICAL)
    path = args.out / "watchdog.json"
    res = json.loads(path.read_text())
    res["drop_in"] = bench_drop_in(20_000, 1000, args.torch_trials)
    table = render(res) + render_drop_in(res["drop_in"])
    print(render_drop_in(res["drop_in"]))
    (args.out / "watchdog.md").write_text(table)
    path.write_text(json.dumps(res, indent=2) + "\n")
    d = res["drop_in"]
    ok = d["cost"]["dropin"]["explicit"]["p50_us"] < d["cost"]["torch"]["explicit"]["p50_us"] / 2
    print("targets met" if ok else "TARGETS MISSED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
