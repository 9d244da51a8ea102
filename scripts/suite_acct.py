"""Where a whole run's CPU goes, every process counted: Linux process accounting around a command (root).

``DISTINIT_TEST_CPU`` (``scripts/suite_cpu.py``) counts what each test's pytest process reaps. Some CPU is never
reaped by a test: the tasks ``srun`` starts are ``slurmstepd``'s children (a daemon's), the ``run_distributed``
ranks are reaped by multiprocessing's fork server, the fork servers and xdist workers end with the session. The
kernel's process accounting (``acct(2)``, BSD process accounting, format v3) records every process that ends,
whoever reaps it: its pid, parent pid, command name and CPU time. A sampler thread reads each live process's
command line from ``/proc`` every 0.3 s, so longer-lived processes are named by what they ran.

Usage (root; the kernel needs CONFIG_BSD_PROCESS_ACCT, no package is needed):

    python scripts/suite_acct.py run DIR -- make test        # accounting on, the command, accounting off
    python scripts/suite_acct.py report DIR [--out F.json]   # the summary again, from DIR

The report: the CPU of every process that ended, by kind (a process under a Slurm daemon, an xdist worker, a fork
server or its child, a launcher, ...), and the "interpreters": processes that used at least
:data:`INTERPRETER_CPU` CPU-seconds, almost all of them fresh Python interpreters that imported torch (about 3
CPU-seconds each on CI's machine), listed by what they ran. Accounting is on for the whole machine while the
command runs: run nothing else beside it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``struct acct_v3`` (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float),
#: utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16].
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
#: The kernel's clock for accounting times (AHZ).
AHZ = 100
#: A process that used this much CPU is counted as an interpreter that imported torch.
INTERPRETER_CPU = 1.5
SAMPLE_EVERY = 0.3
SLURM = frozenset({"slurmd", "slurmctld", "slurmstepd", "munged"})


def comp_t(value: int) -> int:
    """Decode ``comp_t``: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


@dataclass
class Proc:
    """One ended process, as the kernel recorded it (plus its command line when the sampler saw it alive)."""

    pid: int
    ppid: int
    comm: str
    cpu: float
    cmd: str = ""
    parent: int = 0  # the parent the sampler saw (before any reparenting); ppid when it was never seen


def parse(data: bytes) -> list[Proc]:
    """The v3 records of a pacct file."""
    procs = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        if fields[1] & 0x0F != 3:
            raise ValueError(f"record at byte {offset}: accounting format {fields[1] & 0x0F}, not v3")
        pid, ppid, utime, stime = fields[6], fields[7], fields[10], fields[11]
        comm = fields[18].split(b"\0", 1)[0].decode("utf-8", "replace")
        procs.append(Proc(pid, ppid, comm, (comp_t(utime) + comp_t(stime)) / AHZ, parent=ppid))
    return procs


def kind_of(proc: Proc, by_pid: dict[int, Proc]) -> str:
    """What a process was, from its name, its command line and its ancestors."""
    cmd = proc.cmd
    if proc.comm in SLURM:
        return "slurm daemon"
    parent = by_pid.get(proc.parent)
    if "multiprocessing.forkserver" in cmd:
        in_server = parent is not None and "multiprocessing.forkserver" in parent.cmd
        return "run_distributed rank (forkserver child)" if in_server else "multiprocessing fork server"
    if "_zygote.py" in cmd:
        return "tests' fork server child" if parent is not None and "_zygote.py" in parent.cmd else "tests' fork server"
    if "exec(eval(sys.stdin" in cmd:
        return "xdist worker"
    seen: set[int] = set()
    while parent is not None and parent.pid not in seen:
        seen.add(parent.pid)
        if parent.comm in SLURM:
            return "under a Slurm daemon (srun tasks)"
        parent = by_pid.get(parent.parent)
    return proc.comm


def what_ran(proc: Proc) -> str:
    """The script, module or command an interpreter ran (its command name when never sampled)."""
    words = proc.cmd.split()
    for word in words[1:]:
        if word.endswith(".py"):
            return word.rsplit("/", 1)[-1]
    if "-m" in words[1:-1]:
        return "-m " + words[words.index("-m") + 1]
    names = [word.rsplit("/", 1)[-1] for word in words]
    if names and "python" not in names[0]:
        return " ".join(names[:2])  # a program of its own: mpirun, srun, ...
    return " ".join(names[1:3])[:60] or proc.comm


def summarize(procs: Iterable[Proc], top: int = 30) -> dict[str, Any]:
    """CPU by kind, and the interpreters by what they ran."""
    rows = list(procs)
    by_pid = {p.pid: p for p in rows}
    kinds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    ran: Counter[str] = Counter()
    ran_counts: Counter[str] = Counter()
    for proc in rows:
        kind = kind_of(proc, by_pid)
        kinds[kind] += proc.cpu
        counts[kind] += 1
        if proc.cpu >= INTERPRETER_CPU:
            key = f"{what_ran(proc)} ({kind})" if kind != proc.comm else what_ran(proc)
            ran[key] += proc.cpu
            ran_counts[key] += 1
    heavy = [p.cpu for p in rows if p.cpu >= INTERPRETER_CPU]
    return {
        "processes": len(rows),
        "cpu_s": round(sum(p.cpu for p in rows), 1),
        "by_kind": {k: {"cpu": round(v, 1), "processes": counts[k]} for k, v in kinds.most_common()},
        "interpreters": {
            "count": len(heavy),
            "cpu_s": round(sum(heavy), 1),
            "median_cpu_s": round(sorted(heavy)[len(heavy) // 2], 2) if heavy else 0.0,
            "by_what_ran": {k: {"cpu": round(v, 1), "processes": ran_counts[k]} for k, v in ran.most_common(top)},
        },
    }


def sample(out: Path, stop: threading.Event) -> None:
    """Append ``[pid, ppid, cmdline]`` for every process first seen alive, until ``stop`` is set."""
    seen: set[tuple[str, str]] = set()
    with out.open("a") as sink:
        while not stop.wait(SAMPLE_EVERY):
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                    key = (name, stat[19])  # pid and start time: a recycled pid is a new process
                    if key in seen:
                        continue
                    cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").strip()
                except (OSError, IndexError):
                    continue
                if cmd:
                    seen.add(key)
                    sink.write(json.dumps([int(name), int(stat[1]), cmd[:300].decode("utf-8", "replace")]) + "\n")
            sink.flush()


def load(where: Path) -> list[Proc]:
    """The ended processes of a run directory, each with the command line the sampler saw."""
    procs = parse((where / "pacct").read_bytes())
    seen: dict[int, tuple[int, str]] = {}
    sampled = where / "procs.jsonl"
    if sampled.exists():
        for line in sampled.read_text().splitlines():
            pid, ppid, cmd = json.loads(line)
            seen[pid] = (ppid, cmd)
    for proc in procs:
        if proc.pid in seen:
            proc.parent, proc.cmd = seen[proc.pid]
    return procs


def _acct(path: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(path.encode() if path else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"acct({path!r}): {os.strerror(errno)} (root and CONFIG_BSD_PROCESS_ACCT needed)")


def run(where: Path, command: list[str]) -> int:
    """Accounting on into ``where``, the command, accounting off; the command's exit status."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "pacct").write_bytes(b"")
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(where / "procs.jsonl", stop), daemon=True)
    _acct(str(where / "pacct"))
    try:
        sampler.start()
        return subprocess.call(command)
    finally:
        _acct(None)
        stop.set()
        sampler.join(5)


def show(summary: dict[str, Any]) -> None:
    """Print a summary."""
    print(f"{summary['processes']} processes ended, {summary['cpu_s']} CPU-s\n\nCPU-s   procs  kind")
    for kind, row in summary["by_kind"].items():
        if row["cpu"] >= 0.5:
            print(f"{row['cpu']:7.1f} {row['processes']:6d}  {kind}")
    heavy = summary["interpreters"]
    print(
        f"\n{heavy['count']} processes used >= {INTERPRETER_CPU} CPU-s each: {heavy['cpu_s']} CPU-s,"
        f" median {heavy['median_cpu_s']}\n\nCPU-s   procs  what ran (kind)"
    )
    for what, row in heavy["by_what_ran"].items():
        print(f"{row['cpu']:7.1f} {row['processes']:6d}  {what}")


def main(argv: list[str] | None = None) -> int:
    """``run DIR -- COMMAND...`` or ``report DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="run COMMAND with process accounting into DIR, then report")
    run_parser.add_argument("dir", type=Path)
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    report = sub.add_parser("report", help="report a run directory again")
    report.add_argument("dir", type=Path)
    for each in (run_parser, report):
        each.add_argument("--top", type=int, default=30, help="how many kinds of interpreter to list")
        each.add_argument("--out", type=Path, help="also write the summary as JSON here")
    args = parser.parse_args(argv)
    status = 0
    if args.action == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("run needs a command after --")
        status = run(args.dir, command)
    summary = summarize(load(args.dir), args.top)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    show(summary)
    return status


if __name__ == "__main__":
    sys.exit(main())
