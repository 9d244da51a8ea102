"""Start the ranks of a ``via=`` scenario as real processes, some inside fake hosts (private /dev/shm)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests._zygote import popen

WORKER = Path(__file__).with_name("via_worker.py")
_STRIP = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "GLOO_")
_WORLD = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def segments() -> list[str]:
    """distinit's broadcast segments in this host's /dev/shm."""
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith("distinit-bc-"))


PID_NAMESPACE = "pid namespace"
"""A ``hosts`` entry's second item: a private pid namespace that shares this host's /dev/shm."""


def fake_host(shm_size: str) -> str:
    """A shell prefix: a private mount namespace whose /dev/shm is a fresh tmpfs of ``shm_size`` (another host),
    or (:data:`PID_NAMESPACE`) a private pid namespace with its own /proc and this host's /dev/shm."""
    if shm_size == PID_NAMESPACE:
        return "unshare --pid --fork --mount-proc sh -c 'true && "
    return f"unshare --mount --propagation private sh -c 'mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && "


class Job:
    """One job's ranks; ``hosts`` lists rank groups and the /dev/shm size of each fake host (None: this host).

    ``procs``: on this host (without ``after``) the ranks themselves (tests/_zygote.py); in a fake host, its shell.
    ``fresh``: start every rank through a shell and a fresh interpreter, never forked with torch already imported
    (a rank that must register an atexit handler before torch registers any).

    ``after``: a shell command each host's shell runs once its ranks exited (inside its fake host).
    """

    def __init__(
        self,
        tmp_path: Path,
        scenario: str,
        hosts: Sequence[tuple[Sequence[int], str | None]],
        *,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        after: str | None = None,
        fresh: bool = False,
    ) -> None:
        self.tmp_path, self.port = tmp_path, free_port()
        self.world = sum(len(ranks) for ranks, _ in hosts)
        base = {k: v for k, v in os.environ.items() if not k.startswith(_STRIP) and k not in _WORLD}
        base.update(PYTHONWARNINGS="ignore", TORCH_CPP_LOG_LEVEL="ERROR", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(self.port), WORLD_SIZE=str(self.world), **(env or {}))  # fmt: skip
        argv = list(command or [sys.executable, str(WORKER), scenario])
        self.procs: list[subprocess.Popen[bytes]] = []
        for ranks, shm_size in hosts:
            if shm_size is None and after is None and not fresh:  # this host: a process per rank, forked with torch in
                for i, r in enumerate(ranks):
                    with (tmp_path / f"rank{r}.out").open("wb") as out, (tmp_path / f"rank{r}.err").open("wb") as err:
                        environ = {**base, "RANK": str(r), "LOCAL_RANK": str(i)}
                        self.procs.append(popen(argv, env=environ, stdout=out, stderr=err))
                continue
            starts = [
                f"RANK={r} LOCAL_RANK={i} {shlex.join(argv)} >{tmp_path}/rank{r}.out 2>{tmp_path}/rank{r}.err &"
                for i, r in enumerate(ranks)
            ]
            script = " ".join(starts) + " wait" + (f"; {after}" if after else "")
            line = f"{fake_host(shm_size)}{script}'" if shm_size else script
            self.procs.append(subprocess.Popen(["sh", "-c", line], env=base))

    def results(self, timeout: float) -> list[dict[str, Any]]:
        """Every rank's RESULT document (rank order); ``{"exit": "killed"}`` for a rank that printed none."""
        try:
            for proc in self.procs:
                proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"ranks ran past {timeout} s:\n{self.logs()}") from None
        found = []
        for r in range(self.world):
            lines = [x for x in (self.tmp_path / f"rank{r}.out").read_text().splitlines() if x.startswith("RESULT ")]
            found.append(json.loads(lines[-1][7:]) if lines else {"exit": "no result"})
        return found

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {r}\n{(self.tmp_path / f'rank{r}.err').read_text()[-2500:]}" for r in range(self.world)
        )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
