"""Benchmark: the watchdog's routes under torchrun, for a hung rank and for a rank waiting in a collective on it.

Routes (client / server), each a ``torchrun --standalone --nproc-per-node 2 --max-restarts 0`` job of
``tests/integration/watchdog/ft_collective.py``:

* ``torch/torch``: torch's ``FileTimerClient``; torch's ``FileTimerServer``, run by the agent
  (``TORCHELASTIC_ENABLE_FILE_TIMER=1``, ``max_interval`` 0.1 s);
* ``drop-in/torch``: ``distinit.watchdog.elastic``'s client under the agent's torch server;
* ``torch/distinit``: torch's client; ``distinit watchdog serve --torch-fifo`` (the agent runs no server);
* ``drop-in/distinit``: the drop-in client; ``serve --torch-fifo``;
* ``native``: ``WatchdogClient``; ``serve --path`` (for reference: the route the others are measured against).

Scenarios: ``hung``: rank 1 hangs in its own code inside a 3 s region while rank 0 waits for it in an
``all_reduce`` inside a 120 s region (only rank 1 expires); ``collective``: both regions are 3 s, so rank 0
expires too, while it waits for rank 1 (the culprit/victim case).

Per run: each rank's death (a pidfd per worker, timed from its deadline), its exit code as torchrun reports
it, torchrun's exit status and Root Cause, and for distinit's servers the events (verdict, role, outcome,
whether a stack was captured). Workers left running after torchrun ended (the agent killed by torch's server
orphans them) are killed by pid after 30 s; the benchmark is their subreaper, so their exit codes are known too.

Usage: ``python benchmarks/bench_watchdog_routes.py [--repeats 1] [--routes R ...] [--scenarios S ...]``.
Prints a table and writes ``benchmarks/results/watchdog_routes.{md,json}``. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import select
import signal
import statistics
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
WORKER = str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "watchdog" / "ft_collective.py")
#: route -> (ft_collective's client kind, server: "torch" = the agent's FileTimerServer, "fifo", "native").
ROUTES = {
    "torch/torch": ("torch", "torch"),
    "drop-in/torch": ("distinit", "torch"),
    "torch/distinit": ("torch", "fifo"),
    "drop-in/distinit": ("distinit", "fifo"),
    "native": ("native", "native"),
}
SCENARIOS = ("hung", "collective")
HUNG, AFTER, WAITER_AFTER = 1, 3.0, 120.0
ORPHAN_WAIT = 30.0
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# Where torchrun prints each failure: "[i]:\n  time : ...\n  host : ...\n  rank : R (local_rank: L)\n  exitcode : X".
_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def _wait_event(events: Path, predicate: Any, timeout: float) -> list[dict[str, Any]]:
    """The events once ``predicate(events)`` holds (or after ``timeout`` seconds, whatever they are)."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
        if predicate(found):
            break
        time.sleep(0.02)
    return found


def _start_daemon(tmp: Path, fifo: Path | None, events: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "distinit.cli", "watchdog", "serve", "--path", str(tmp / "wd"), "--grace", "0"]
    args += ["--events", str(events), *(["--torch-fifo", str(fifo)] if fifo else [])]
    with open(tmp / "serve.log", "wb") as log:
        daemon = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    started = _wait_event(events, lambda evs: any(e["event"] == "watchdog.started" for e in evs), 60)
    if fifo is not None:
        until = time.monotonic() + 30
        while not fifo.exists() and time.monotonic() < until:
            time.sleep(0.02)
    if not started or daemon.poll() is not None:
        raise RuntimeError(f"the daemon did not start: {(tmp / 'serve.log').read_text()[-2000:]}")
    return daemon


def _watch(proc: subprocess.Popen[bytes], limit: float) -> tuple[dict[int, dict[str, Any]], dict[int, float]]:
    """Read the workers' ready lines and time each worker's death (epoch s) through a pidfd; bounded.

    Ends once torchrun has exited and every worker is dead, or ORPHAN_WAIT seconds after torchrun exited
    (workers still running then are orphans: killed here, by their pidfd), or after ``limit`` seconds.
    """
    assert proc.stdout is not None
    out = proc.stdout.fileno()
    ready: dict[int, dict[str, Any]] = {}
    pidfds: dict[int, int] = {}
    died: dict[int, float] = {}
    buffer, reading = b"", True
    end = time.monotonic() + limit
    ended_at: float | None = None
    try:
        while time.monotonic() < end:
            if ended_at is None and proc.poll() is not None:
                ended_at = time.monotonic()
            if ended_at is not None and (len(died) == len(pidfds) or time.monotonic() - ended_at > ORPHAN_WAIT):
                break
            fds, _, _ = select.select(([out] if reading else []) + list(pidfds.values()), [], [], 0.05)
            now = time.time()
            died.update({rank: now for rank, fd in pidfds.items() if fd in fds and rank not in died})
            if out in fds:
                chunk = os.read(out, 65536)
                reading = bool(chunk)
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.startswith(b"{"):
                        doc = json.loads(line)
                        ready[doc["rank"]] = doc
                        with contextlib.suppress(OSError):
                            pidfds[doc["rank"]] = os.pidfd_open(doc["pid"])
        for rank, fd in pidfds.items():
            if rank not in died:
                ready[rank]["orphaned"] = True
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            status = _reap_orphan(fd)
            if status is not None:  # torchrun died before it could reap (or report) this worker
                ready[rank]["orphan_exitcode"] = status
    finally:
        for fd in pidfds.values():
            os.close(fd)
    return ready, died


def _become_subreaper() -> None:
    """Workers whose torchrun dies are re-parented to this process (not to init): their exit codes stay known."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphan(pidfd: int) -> int | None:
    """The exit code of a worker re-parented to this process (-N: killed by signal N); None if not ours."""
    try:  # dead or just SIGKILLed when called: an orphan of ours is reaped at once, another's is refused
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except ChildProcessError:  # torchrun's child: torchrun reaps it and reports it
        return None
    if info is None:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def run_once(route: str, scenario: str) -> dict[str, Any]:
    """One torchrun job of ``route`` in ``scenario``: who died when, torchrun's verdict, the events."""
    client, server = ROUTES[route]
    with tempfile.TemporaryDirectory(prefix="bench-wd-routes-") as name:
        tmp = Path(name)
        fifo, events = tmp / "timer.fifo", tmp / "events.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "DISTINIT_WATCHDOG"))}
        env["OMP_NUM_THREADS"] = "1"
        daemon = None
        if server == "torch":
            env.update(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=str(fifo))
        elif server == "fifo":
            daemon = _start_daemon(tmp, fifo, events)
            env["TORCHELASTIC_TIMER_FILE"] = str(fifo)
        else:
            daemon = _start_daemon(tmp, None, events)
            env["DISTINIT_WATCHDOG"] = str(tmp / "wd")
        waiter = [str(WAITER_AFTER)] if scenario == "hung" else []
        command = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval"]
        command += ["0.1", WORKER, client, str(HUNG), str(AFTER), *waiter]
        started = time.monotonic()
        with open(tmp / "torchrun.err", "wb") as err:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            ready, died = _watch(proc, 240)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
        expired: list[dict[str, Any]] = []
        if daemon is not None:
            want = 1 if scenario == "hung" else 2  # a victim's event comes after the hold: wait for it
            found = _wait_event(events, lambda evs: sum(e["event"] == "watchdog.expired" for e in evs) >= want, 30)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
            expired = [e for e in found if e["event"] in ("watchdog.expired", "watchdog.verdict")]
        stderr = (tmp / "torchrun.err").read_text(errors="replace")
    return _summarise(route, scenario, proc.returncode, stderr, ready, died, expired, time.monotonic() - started)


def _summarise(
    route: str,
    scenario: str,
    rc: int,
    stderr: str,
    ready: dict[int, dict[str, Any]],
    died: dict[int, float],
    events: list[dict[str, Any]],
    wall: float,
) -> dict[str, Any]:
    root = stderr.rpartition("Root Cause")[2] if "Root Cause" in stderr else ""
    root_match = _FAILURE.search(root)
    codes = {int(r): int(code) for r, code in _FAILURE.findall(stderr)}
    by_pid = {e["pid"]: e for e in events if e["event"] == "watchdog.expired"}
    ranks = {}
    for rank, doc in sorted(ready.items()):
        ev = by_pid.get(doc["pid"])
        ranks[rank] = {
            "pid": doc["pid"],
            "died_after_deadline_s": None if rank not in died else round(died[rank] - doc["deadline"], 3),
            "exitcode": codes.get(rank, doc.get("orphan_exitcode")),
            "orphaned": "orphan_exitcode" in doc,  # its torchrun died first: re-parented to this benchmark
            "killed_here": doc.get("orphaned", False),  # still running ORPHAN_WAIT s after torchrun ended
            "event": None
            if ev is None
            else {"role": ev["role"], "outcome": ev["outcome"], "signals": ev["signals"], "stack": bool(ev["stack"])},
        }
    order = sorted((t, r) for r, t in died.items())
    verdict = next((e["detail"] for e in events if e["event"] == "watchdog.verdict"), None)
    return {
        "route": route,
        "scenario": scenario,
        "torchrun_rc": rc,
        "root_cause_rank": None if root_match is None else int(root_match[1]),
        "death_order": [r for _, r in order],
        "death_gap_s": round(order[1][0] - order[0][0], 3) if len(order) == 2 else None,
        "hung_rank_died_after_deadline_s": ranks.get(HUNG, {}).get("died_after_deadline_s"),
        "ranks": ranks,
        "verdict": verdict,
        "wall_s": round(wall, 1),
    }


def _fate(rank: dict[str, Any]) -> str:
    """How one rank ended, in a few words: by whom, and its exit code."""
    ev, code = rank["event"], rank["exitcode"]
    if rank["killed_here"]:
        return "orphaned, still running 30 s after torchrun: killed by the benchmark"
    orphan = "orphaned (its agent was killed), then " if rank["orphaned"] else ""
    if ev is not None and ev["outcome"] == "killed":
        who = f"watchdog {'+'.join(ev['signals'])}"
    elif code == -15:
        who = "torchrun's SIGTERM"
    elif code == -9:
        who = "SIGKILL"
    elif code is None:
        who = "exit not reported"
    else:
        who = f"exit {code}"
    stack = "" if ev is None else (", stack" if ev["stack"] else ", no stack")
    role = "" if ev is None or ev["role"] is None else f" [{ev['role']}]"
    return f"{orphan}{who}{role}{stack}"


def render(runs: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    lines = [
        "# Watchdog routes under torchrun: a hung rank, and a rank waiting in a collective on it",
        "",
        f"{facts['when']}, {facts['cpus']} CPUs, torch {facts['torch']}, load {facts.get('load_average_at_start')}"
        f" -> {facts['load_average_at_end']}. `{facts['command']}`. Rank 1 hangs in its own code (3 s region);",
        "rank 0 waits for it in a gloo all_reduce (`hung`: 120 s region, never expires; `collective`: 3 s region).",
        "Times from each rank's deadline to its death, seen through a pidfd.",
        "",
        "| route (client/server) | scenario | rank 1 | rank 0 | rank 1 dead after deadline | first to die "
        "| torchrun Root Cause | torchrun rc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        ranks = run["ranks"]
        hang = run["hung_rank_died_after_deadline_s"]
        root = "none printed" if run["root_cause_rank"] is None else f"rank {run['root_cause_rank']}"
        first = ", ".join(f"rank {r}" for r in run["death_order"][:1]) or "-"
        gap = "" if run["death_gap_s"] is None else f" ({run['death_gap_s']:.2f} s before the other)"
        lines.append(
            f"| {run['route']} | {run['scenario']} | {_fate(ranks[1]) if 1 in ranks else '-'} "
            f"| {_fate(ranks[0]) if 0 in ranks else '-'} | {'-' if hang is None else f'{hang:.3f} s'} "
            f"| {first}{gap} | {root} | {run['torchrun_rc']} |"
        )
    verdicts = [(r["route"], r["scenario"], r["verdict"]) for r in runs if r["verdict"]]
    if verdicts:
        lines += ["", "Verdicts (`watchdog.verdict`):", ""]
        lines += [f"* {route}, {scenario}: {text}" for route, scenario, text in verdicts]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--routes", nargs="+", choices=list(ROUTES), default=list(ROUTES))
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    at_start = load_average()
    _become_subreaper()
    runs = []
    for _ in range(args.repeats):
        for route in args.routes:
            for scenario in args.scenarios:
                run = run_once(route, scenario)
                print(json.dumps({k: run[k] for k in ("route", "scenario", "death_order", "root_cause_rank")}))
                runs.append(run)
    facts = machine_facts(load_at_start=at_start)
    hang = [r["hung_rank_died_after_deadline_s"] for r in runs if r["hung_rank_died_after_deadline_s"] is not None]
    summary = {"median_hang_to_death_s": statistics.median(hang) if hang else None}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watchdog_routes.json").write_text(
        json.dumps({"runs": runs, "summary": summary, "machine_facts": facts}, indent=2) + "\n"
    )
    table = render(runs, facts)
    (args.out / "watchdog_routes.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
