"""Helpers for the torchrun rendezvous tests: real torchrun agents as separate processes, each with its log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TRAIN = Path(__file__).with_name("_train.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
#: Short timeouts so a failing scenario costs seconds (torch's keep-alive every second, dead after 3).
FAST_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"


PRIMED = Path(__file__).with_name("_primed_torchrun.py")


@dataclass
class Agent:
    """One torchrun agent (its own session, so its workers stop with it)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    #: For an agent started ``primed``: the file it writes once imported, and the file that lets it run.
    ready: Path | None = None
    go_file: Path | None = None

    def wait_ready(self, timeout: float) -> None:
        """Wait until a primed agent has imported torchrun and the backend (it then waits for :meth:`go`)."""
        assert self.ready is not None, "not started primed"
        end = time.monotonic() + timeout
        while not self.ready.exists():
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < end, f"{self.name} not imported after {timeout} s"
            time.sleep(0.02)

    def go(self) -> None:
        """Let a primed agent run torchrun (it joins within milliseconds)."""
        assert self.go_file is not None, "not started primed"
        self.go_file.touch()

    def wait(self, timeout: float) -> tuple[int, str, float]:
        """(exit code, log text, seconds since start); kills the agent's session if it outlives ``timeout``."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.wait(timeout=10)
        return rc, self.log.read_text(errors="replace"), time.monotonic() - self.started

    def kill(self) -> None:
        """SIGKILL this agent and its workers (its own process group, and its children: torchrun may give its
        workers sessions of their own)."""
        if self.proc.poll() is None:
            pinned = []  # pidfds, opened while the agent (unreaped: ours to reap) still holds them as children
            for pid in _children(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    pinned.append(os.pidfd_open(pid))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for fd in pinned:  # through the pidfd: a child that already exited is not signalled by its number
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                os.close(fd)


def _children(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == parent:
            found.append(int(entry.name))
    return found


class Agents:
    """Starts agents in a test's tmp dir and stops every one it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Agent] = []
        self.marks = tmp / "marks"
        self.marks.mkdir()

    def start(
        self,
        name: str,
        endpoint: str,
        *,
        nnodes: str = "2",
        nproc: int = 1,
        run_id: str = "job",
        conf: str = "join_timeout=30",
        backend: str = "distinit",
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        script: Path = TRAIN,
        torchrun: Sequence[str] = (str(TORCHRUN),),
        primed: bool = False,
    ) -> Agent:
        """Start ``torchrun`` for ``script`` (:data:`TRAIN`) with these flags; output goes to ``<tmp>/<name>.log``.

        ``torchrun``: the command that runs torchrun (``[python, "-m", "distinit.rendezvous"]`` on a torch that
        loads no ``torchrun.handlers`` entry point). ``primed``: import first, run on :meth:`Agent.go`
        (:data:`PRIMED`), for a test whose round must form within a short ``join_timeout`` on a loaded machine.
        """
        log = self.tmp / f"{name}.log"
        ready = go = None
        if primed:
            ready, go = self.tmp / f"{name}.ready", self.tmp / f"{name}.go"
            torchrun = (sys.executable, str(PRIMED), str(ready), str(go))
        command = [
            *prefix,
            *torchrun,
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={run_id}",
            f"--rdzv-conf={FAST_CONF},{conf}",
            "--monitor-interval=0.2",
            *extra,
            str(script),
        ]
        environ = {**os.environ, "DISTINIT_TEST_MARKS": str(self.marks), "OMP_NUM_THREADS": "1", **(env or {})}
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
        agent = Agent(name, proc, log, time.monotonic(), ready, go)
        self.started.append(agent)
        return agent

    def wait_for_marks(self, count: int, timeout: float) -> bool:
        """Whether ``count`` workers wrote their mark (their group formed) within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(list(self.marks.iterdir())) >= count:
                return True
            if all(agent.proc.poll() is not None for agent in self.started):
                break
            time.sleep(0.1)
        return len(list(self.marks.iterdir())) >= count

    def stop(self) -> None:
        """Kill every agent still running (by its own process group) and reap it."""
        for agent in self.started:
            agent.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.proc.wait(timeout=10)
