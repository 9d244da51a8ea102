"""The two-ended torch matrix (issue 35): the unit tests and a real-process smoke test on each torch given.

For each version: a venv ``.venv-torch-<version>`` with ``pip install torch==<version>`` from the package
index and its dependencies (skipped while the venv's stamp names that version and the same pip arguments),
then distinit in editable mode with the ``test`` extra (torch pinned again, so no extra can move it). Then,
in that venv, ``pytest tests/unit`` and ``pytest tests/integration/compat`` (the smoke test: ``setup()`` on
4 ranks, broadcast, the watchdog, the doctor under torchrun, the torchrun backend, the FileTimer drop-in).
One line per (torch, step) with its verdict, wall seconds and pytest's summary (and every skip with its
reason); the exit status is 1 when any step failed.

Run by ``make test-compat`` (``COMPAT_TORCH``, ``COMPAT_PIP_ARGS``); only the standard library is used, so
any Python 3.10+ can run it before a venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".distinit-compat"

#: Wall-clock bounds per step, seconds: a hung step fails with its name instead of stalling CI.
INSTALL_TIMEOUT = 3600.0  # the CUDA wheels of one torch are 2-4 GB
UNIT_TIMEOUT = 1800.0
SMOKE_TIMEOUT = 900.0


@dataclass(frozen=True)
class Step:
    """One step's outcome: what ran, whether it passed, how long it took and what it said last."""

    torch: str
    name: str
    ok: bool
    seconds: float
    tail: str = ""


def _stamp_text(version: str, pip_args: list[str]) -> str:
    """What the stamp of a venv holding torch ``version`` says: a venv built for anything else is rebuilt."""
    return f"torch=={version}\npip-args={shlex.join(pip_args)}\n"


def _run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Run ``argv`` from the checkout, bounded; return (exit status 0, its output).

    The command gets a session of its own, so a step that outlives ``timeout`` is killed with everything it
    started (pytest's workers, the ranks), not only its first process.
    """
    with subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return False, f"{out}\ntimed out after {timeout:.0f} s: {shlex.join(argv)}"
    return proc.returncode == 0, out


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def install(version: str, venv: Path, pip_args: list[str], python: str) -> Step:
    """Build ``venv`` with torch ``version`` (unless its stamp says it has it), then install distinit in it.

    Only the torch step is skipped when the stamp matches: it is the expensive one (2-4 GB of CUDA wheels).
    distinit and its ``test`` extra are installed every time (pip does nothing when all is satisfied), so a
    dependency added to pyproject.toml reaches a reused venv. torch is named again so no extra can move it.
    """
    stamp = venv / STAMP
    want = _stamp_text(version, pip_args)
    start = time.monotonic()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *pip_args]
    steps = [[*pip, f"torch=={version}", "-e", ".[test]"]]
    reused = stamp.is_file() and stamp.read_text() == want
    if not reused:
        shutil.rmtree(venv, ignore_errors=True)
        steps[:0] = [[python, "-m", "venv", str(venv)], [*pip, f"torch=={version}"]]
    for argv in steps:
        ok, out = _run(argv, timeout=INSTALL_TIMEOUT)
        if not ok:
            return Step(version, "install", False, time.monotonic() - start, _tail(out))
        if argv[-1] == f"torch=={version}":
            stamp.write_text(want)
    return Step(version, "install (reused)" if reused else "install", True, time.monotonic() - start)


def pytest_step(version: str, venv: Path, name: str, args: list[str], timeout: float) -> Step:
    """Run pytest in ``venv`` with ``args``; the step passes when pytest exits 0."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    start = time.monotonic()
    ok, out = _run([str(venv / "bin" / "python"), "-m", "pytest", *args], timeout=timeout, env=env)
    return Step(version, name, ok, time.monotonic() - start, _tail(out))


def disk_mb(path: Path) -> float:
    """The bytes under ``path`` in MB (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total / 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the matrix; print one line per (torch, step); exit 1 when any step failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", help="torch versions, e.g. 2.4.1 2.14.1")
    parser.add_argument("--python", default=sys.executable, help="the Python that creates the venvs")
    parser.add_argument("--pip-args", default="", help="extra pip arguments, e.g. an --index-url")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments for both test steps")
    parser.add_argument("--workers", default="2", help="pytest-xdist workers for the unit tests (-n)")
    opts = parser.parse_args(argv)
    pip_args = shlex.split(opts.pip_args)
    extra = shlex.split(opts.pytest_args)
    steps: list[Step] = []

    def report(step: Step) -> None:
        steps.append(step)
        verdict = "pass" if step.ok else "FAIL"
        last = step.tail.splitlines()[-1].strip("= ") if step.tail.strip() else ""
        print(f"compat torch={step.torch:<8} {step.name:<18} {verdict} {step.seconds:7.1f} s  {last}", flush=True)
        for line in step.tail.splitlines() if step.ok else ():  # every skip, with its reason
            if line.startswith("SKIPPED"):
                print("    " + line, flush=True)
        if not step.ok:
            print("\n".join("    " + line for line in step.tail.splitlines()), flush=True)

    for version in opts.versions:
        venv = ROOT / f".venv-torch-{version}"
        report(install(version, venv, pip_args, opts.python))
        if not steps[-1].ok:
            continue
        print(f"compat torch={version:<8} disk {disk_mb(venv):.0f} MB in {venv.name}", flush=True)
        report(pytest_step(version, venv, "unit", ["tests/unit", "-q", "-n", opts.workers, *extra], UNIT_TIMEOUT))
        report(
            pytest_step(
                version, venv, "smoke", ["tests/integration/compat", "-q", "-n", opts.workers, *extra], SMOKE_TIMEOUT
            )
        )
    failed = [s for s in steps if not s.ok]
    print(f"compat: {len(steps) - len(failed)} of {len(steps)} steps passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
