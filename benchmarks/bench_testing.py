"""Benchmark distinit.testing against torch's MultiProcessTestCase, side by side in one run.

Run:  .venv/bin/python benchmarks/bench_testing.py [--tests 8]

Each framework runs the same tests in a fresh pytest session (a subprocess, so the first test pays
every start-up cost a user pays), timed by a small plugin that records each test's setup + call +
teardown wall time:

- trivial: a 2-rank all_reduce, N tests in a row (first, and median of the rest);
- reuse: the same with ``@pytest.mark.distributed(reuse=True)`` (distinit only; torch has no
  per-test equivalent: ``MultiProcContinuousTest`` is per class);
- raise -> report: rank 1 writes ``time.time()`` and raises while rank 0 waits in a barrier; the
  figure is the wall time from that raise to the test's report;
- hang -> report: rank 0 waits in a barrier, rank 1 writes ``time.time()`` and sleeps; timeout
  5 s; the figures are the wall time from that moment to the test's report (both harnesses start
  their clock earlier, when the ranks start) and the test's whole wall time minus the timeout;
- kill after the last collective: rank 1 is SIGKILLed after the final barrier; does the test fail?

The raise, hang and kill scenarios run after one warm-up test in their session, so they time the
failure handling rather than start-up (which the first trivial test shows).

torch's ``MultiProcessTestCase`` needs the ``expecttest`` package (``pip install expecttest``).
Prints a table and writes ``benchmarks/results/testing.md`` and ``testing.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TIMEOUT = 5

TIMER_PLUGIN = """
import json, os, time

_times = {}

def pytest_runtest_logreport(report):
    entry = _times.setdefault(report.nodeid.split("::")[-1], {"duration": 0.0})
    entry["duration"] += report.duration
    if report.when == "call":
        entry["reported_at"] = time.time()
        entry["outcome"] = report.outcome
        entry["message"] = (report.longreprtext or "").strip().splitlines()[-1:] if report.failed else []

def pytest_sessionfinish(session):
    with open(os.environ["BENCH_TIMES"], "w") as handle:
        json.dump(_times, handle)
"""

DISTINIT_TESTS = """
import os, signal, time
import pytest, torch, torch.distributed as dist

N = int(os.environ["BENCH_N"])


def _trivial():
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert int(tensor) == 2


@pytest.mark.distributed(world_size=2, timeout=60)
def test_0_warm():
    _trivial()


@pytest.mark.distributed(world_size=2, timeout=30)
@pytest.mark.parametrize("i", range(N))
def test_trivial(i):
    _trivial()


@pytest.mark.distributed(world_size=2, timeout=30, reuse=True)
@pytest.mark.parametrize("i", range(N))
def test_reuse(i):
    _trivial()


@pytest.mark.distributed(world_size=2, timeout=30)
def test_raise():
    if dist.get_rank() == 1:
        with open(os.environ["BENCH_RAISED"], "w") as handle:
            handle.write(repr(time.time()))
        raise ValueError("boom")
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=TIMEOUT)
def test_hang():
    if dist.get_rank() == 1:
        with open(os.environ["BENCH_HUNG"], "w") as handle:
            handle.write(repr(time.time()))
        time.sleep(600)
    dist.barrier()


@pytest.mark.distributed(world_size=2, timeout=30)
def test_kill_after_last_collective():
    dist.barrier()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
"""

TORCH_TESTS = """
import os, signal, time, unittest
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

N = int(os.environ["BENCH_N"])


class Bench(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def _trivial(self):
        self._init()
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        assert int(tensor) == 2
        dist.destroy_process_group()

    def test_0_warm(self):
        self._trivial()

    def test_raise(self):
        self._init()
        if self.rank == 1:
            with open(os.environ["BENCH_RAISED"], "w") as handle:
                handle.write(repr(time.time()))
            raise ValueError("boom")
        dist.barrier()

    def test_hang(self):
        self._init()
        if self.rank == 1:
            with open(os.environ["BENCH_HUNG"], "w") as handle:
                handle.write(repr(time.time()))
            time.sleep(600)
        dist.barrier()

    def test_kill_after_last_collective(self):
        self._init()
        dist.barrier()
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


for _i in range(N):
    setattr(Bench, f"test_trivial_{_i}", lambda self: self._trivial())
"""


def run_session(kind: str, tests: int, select: str, work: Path) -> dict[str, Any]:
    """Run one pytest session in a subprocess; return per-test durations and the raise timestamp."""
    src = DISTINIT_TESTS.replace("TIMEOUT", str(TIMEOUT)) if kind == "distinit" else TORCH_TESTS
    session = work / f"{kind}-{select.replace(' ', '_')}"
    session.mkdir()
    (session / f"test_bench_{kind}.py").write_text(textwrap.dedent(src))
    (session / "bench_timer.py").write_text(TIMER_PLUGIN)
    env = dict(os.environ)
    env.update(
        {
            "BENCH_N": str(tests),
            "BENCH_TIMES": str(session / "times.json"),
            "BENCH_RAISED": str(session / "raised.txt"),
            "BENCH_HUNG": str(session / "hung.txt"),
            "PYTHONPATH": os.pathsep.join([str(session), env.get("PYTHONPATH", "")]),
            # torch reads its timeout at import; only the hang session gets the short one.
            "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(TIMEOUT if select == "hang" else 300),
        }
    )
    # Failure scenarios run after a warm-up test, so they time the failure handling, not start-up.
    keyword = select if select in ("trivial", "reuse") else f"0_warm or {select}"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "bench_timer", "-p", "no:cacheprovider", "-k", keyword]
    if kind == "torch":
        cmd += ["-p", "no:distinit"]
    subprocess.run(cmd, cwd=session, env=env, capture_output=True, text=True, timeout=600, check=False)
    times = json.loads((session / "times.json").read_text())
    stamps = {
        name: float(path.read_text()) if path.exists() else None
        for name, path in (("raised_at", session / "raised.txt"), ("hung_at", session / "hung.txt"))
    }
    return {"times": times, **stamps}


def summarise(kind: str, tests: int, work: Path) -> dict[str, Any]:
    """All scenarios of one framework."""
    out: dict[str, Any] = {}
    trivial = run_session(kind, tests, "trivial", work)["times"]
    durations = [trivial[name]["duration"] for name in sorted(trivial, key=_order)]
    out["trivial_outcomes"] = sorted({entry.get("outcome", "?") for entry in trivial.values()})
    out["trivial_first_s"] = durations[0]
    out["trivial_median_s"] = statistics.median(durations[1:])
    out["trivial_durations_s"] = durations  # every test in order: the first pays start-up
    if kind == "distinit":
        reuse = run_session(kind, tests, "reuse", work)["times"]
        reuse_durations = [reuse[name]["duration"] for name in sorted(reuse, key=_order)]
        out["reuse_first_s"] = reuse_durations[0]
        out["reuse_median_s"] = statistics.median(reuse_durations[1:])
        out["reuse_durations_s"] = reuse_durations
    raised = run_session(kind, tests, "raise", work)
    entry = raised["times"]["test_raise"]
    out["raise_outcome"] = entry.get("outcome")
    out["raise_to_report_s"] = entry["reported_at"] - raised["raised_at"] if raised["raised_at"] else None
    hung = run_session(kind, tests, "hang", work)
    hang = hung["times"]["test_hang"]
    out["hang_outcome"] = hang.get("outcome")
    out["hang_wall_minus_timeout_s"] = hang["duration"] - TIMEOUT
    out["hang_to_report_s"] = hang["reported_at"] - hung["hung_at"] if hung["hung_at"] else None
    kill = run_session(kind, tests, "kill_after_last_collective", work)["times"]["test_kill_after_last_collective"]
    out["kill_after_last_collective_outcome"] = kill.get("outcome")
    out["kill_after_last_collective_message"] = kill.get("message")
    return out


def _order(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=8, help="trivial tests per session (default 8)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-testing-") as tmp:
        work = Path(tmp)
        results = {"distinit": summarise("distinit", args.tests, work), "torch": summarise("torch", args.tests, work)}
    rows = [
        ("trivial tests: outcomes", "trivial_outcomes", "passed"),
        ("trivial 2-rank test, first of session (s)", "trivial_first_s", "-"),
        ("trivial 2-rank test, median after first (s)", "trivial_median_s", "<= 1.5"),
        ("with reuse, first (s)", "reuse_first_s", "-"),
        ("with reuse, median after first (s)", "reuse_median_s", "<= 0.3"),
        ("rank raises -> test reported (s)", "raise_to_report_s", "<= 2"),
        ("raise: test outcome", "raise_outcome", "failed"),
        (f"hang starts -> test reported, timeout {TIMEOUT} s (s)", "hang_to_report_s", f"<= {TIMEOUT} + 3"),
        ("hang test wall time minus the timeout (s)", "hang_wall_minus_timeout_s", "-"),
        ("hang: test outcome", "hang_outcome", "failed"),
        ("rank 1 SIGKILLed after last collective: outcome", "kill_after_last_collective_outcome", "failed"),
    ]
    header = "| measure | distinit.testing | torch MultiProcessTestCase | target |\n|---|---|---|---|"
    lines = [header]
    for label, key, target in rows:
        lines.append(
            f"| {label} | {_fmt(results['distinit'].get(key))} | {_fmt(results['torch'].get(key))} | {target} |"
        )
    table = "\n".join(lines)
    print(table)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "tests_per_session": args.tests,
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "command": "python benchmarks/bench_testing.py " + " ".join(sys.argv[1:]),
    }
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        pass
    from _common import machine_facts

    facts = machine_facts(load_at_start=[round(load_before, 2)])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "testing.json").write_text(
        json.dumps({"meta": meta, "machine_facts": facts, "results": results}, indent=2) + "\n"
    )
    (RESULTS / "testing.md").write_text(
        "# distinit.testing vs torch MultiProcessTestCase\n\n"
        f"{meta['date']}, Python {meta['python']}, torch {meta.get('torch')}, {meta['cpus']} CPUs, "
        f"{args.tests} trivial tests per session, each session a fresh `python -m pytest` subprocess; "
        f"1-minute load average {meta['load_average_1min'][0]} before, {meta['load_average_1min'][1]} after "
        "(other work shared the machine).\n"
        f"Command: `{meta['command']}`\n\n{table}\n"
    )


if __name__ == "__main__":
    main()
