"""Helpers for the init fault tests: launch ranks as real processes with per-rank env and timing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_worker.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Rank:
    proc: subprocess.Popen[bytes]
    out: Path
    log: Path
    name: str

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"{self.name} still running after {timeout} s; log:\n{self.log.read_text()[-3000:]}")
        if not self.out.exists():
            raise AssertionError(
                f"{self.name} exited {self.proc.returncode} without a result; log:\n{self.log.read_text()[-3000:]}"
            )
        data: dict[str, Any] = json.loads(self.out.read_text())
        data["returncode"] = self.proc.returncode
        data["log"] = self.log.read_text()
        return data


@dataclass
class Launcher:
    tmp_path: Path
    ranks: list[Rank] = field(default_factory=list)

    def start(
        self,
        rank: int,
        world_size: int,
        port: int,
        *,
        addr: str = "127.0.0.1",
        kwargs: dict[str, Any] | None = None,
        start_after: float = 0.0,
        mode: str = "normal",
        hold: float = 0.0,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        name: str | None = None,
    ) -> Rank:
        name = name or f"rank{rank}-{len(self.ranks)}"
        out = self.tmp_path / f"{name}.json"
        log = self.tmp_path / f"{name}.log"
        spec = {"kwargs": kwargs or {}, "start_after": start_after, "mode": mode, "hold": hold}
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "PMIX_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
        }
        environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR=addr,
            MASTER_PORT=str(port),
            PYTHONWARNINGS="ignore",
            TORCH_CPP_LOG_LEVEL="ERROR",
        )
        environ.update(env or {})
        cmd = [*prefix, sys.executable, str(WORKER), json.dumps(spec), str(out)]
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, env=environ, stdout=fh, stderr=subprocess.STDOUT)
        handle = Rank(proc, out, log, name)
        self.ranks.append(handle)
        return handle

    def stop_all(self) -> None:
        for handle in self.ranks:
            if handle.proc.poll() is None:
                handle.proc.kill()
                handle.proc.wait(timeout=10)
