"""Run ``python -m distinit.doctor`` as real ranks (optionally inside namespaces) and read their JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests._zygote import popen

DOCTOR = [sys.executable, "-m", "distinit.doctor"]
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "NCCL_", "GLOO_", "TP_SOCKET")
_WORLD = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def clean_environ(**world: str) -> dict[str, str]:
    """This process's variables without any launcher's, plus ``world``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES) and k not in _WORLD}
    environ.update(PYTHONWARNINGS="ignore", TORCH_CPP_LOG_LEVEL="ERROR", **world)
    return environ


def rank_environ(rank: int, world_size: int, port: int, *, addr: str = "127.0.0.1", **extra: str) -> dict[str, str]:
    """Plain env:// variables for one rank (all ranks on one host unless ``extra`` says otherwise)."""
    world = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }
    return clean_environ(**{**world, **extra})


def in_uts(hostname: str) -> list[str]:
    """A prefix running the command in a UTS namespace of its own named ``hostname`` (a fake host's name)."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh"]


@dataclass
class Ranks:
    tmp_path: Path
    procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = field(default_factory=list)

    def start(self, environ: dict[str, str], *, args: Sequence[str] = ("--json",), prefix: Sequence[str] = ()) -> None:
        index = len(self.procs)
        out, err = self.tmp_path / f"rank{index}.out", self.tmp_path / f"rank{index}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = popen([*prefix, *DOCTOR, *args], env=environ, stdout=stdout, stderr=stderr)
        self.procs.append((proc, out, err))

    def results(self, timeout: float) -> list[tuple[int, dict[str, Any]]]:
        """(exit status, JSON document) of every rank, in start order; fails with the logs if one hangs."""
        found = []
        for proc, out, err in self.procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                raise AssertionError(f"a doctor rank ran past {timeout} s: {err.read_text()[-3000:]}") from None
            text = out.read_text().strip()
            assert text, f"no output (exit {proc.returncode}): {err.read_text()[-3000:]}"
            found.append((proc.returncode, json.loads(text.splitlines()[-1])))
        return found

    def stop(self) -> None:
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def check(document: dict[str, Any], check_id: str) -> dict[str, Any]:
    """The check ``check_id`` of a JSON report."""
    (found,) = [c for c in document["checks"] if c["id"] == check_id]
    return dict(found)


class Switch:
    """Fake hosts on one layer-2 segment: a bridge in a namespace of its own, one namespace per host with
    ``eth0`` at ``<subnet>.<i+1>``. Root only; every namespace is deleted on close."""

    def __init__(self, tag: str, hosts: int, *, subnet: str = "10.254.7") -> None:
        self.names = [f"distinit-sw-{tag}", *(f"distinit-h{i}-{tag}" for i in range(hosts))]
        self.addresses = [f"{subnet}.{i + 1}" for i in range(hosts)]
        try:
            for name in self.names:
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
            switch = self.names[0]
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.names[1:]):
                _ip("-n", switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", host)
                _ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
                _ip("-n", host, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
                _ip("-n", host, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i + 1]]

    def nft(self, i: int, *commands: str) -> None:
        for command in commands:
            subprocess.run([*self.prefix(i), "nft", command], check=True, timeout=10)

    def close(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], check=False, timeout=10, capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)
