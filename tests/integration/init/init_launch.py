"""Helpers for the init fault tests: launch ranks as real processes with per-rank env and timing."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests._zygote import popen

WORKER = Path(__file__).with_name("_worker.py")


#: Ports :func:`free_port` hands out: below the kernel's ephemeral range (``ip_local_port_range``, 32768-60999
#: by default), so no client socket's connect() and no bind(0) elsewhere takes one between our pick and the
#: rank's bind; below distinit's derived MASTER_PORTs (20000-32767), which the Slurm and MPI tests' jobs use beside
#: these; below Lightning's Slurm default (15000 and up); above the emulated Slurm cluster's daemons (8100-9909,
#: ``scripts/launchers/cluster.py``). tests/unit/test_cluster_ports.py checks that these ranges stay apart.
PORTS = range(10000, 15000)
#: Ports per pytest-xdist worker: gw0 starts at 10000, gw1 at 10600, ... (eight workers before they wrap).
PORTS_PER_WORKER = 600
_picked = itertools.count(random.randrange(PORTS_PER_WORKER))


def free_port() -> int:
    """A port free on 127.0.0.1 now, never handed out before by this process, distinct from other workers'.

    Each xdist worker (``PYTEST_XDIST_WORKER=gwN``) walks a slice of :data:`PORTS` of its own, from a random
    start: tests side by side never pick the same port, and ports picked for ranks not yet started stay
    distinct within a test. A port in use (another session on the machine) is skipped.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = PORTS.start + (int(worker) if worker.isdigit() else 0) * PORTS_PER_WORKER % len(PORTS)
    for _ in range(PORTS_PER_WORKER):
        port = base + next(_picked) % PORTS_PER_WORKER
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as sock:  # every port of the slice taken: let the kernel pick one
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def uts_reason() -> str | None:
    """Why ranks cannot be given host names of their own here (a UTS namespace each), or None when they can."""
    if os.geteuid() != 0:
        return "emulating two hosts needs root (a UTS namespace per rank)"
    if shutil.which("unshare") is None:
        return "needs unshare(1) from util-linux"
    probe = subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"unshare --uts failed: {probe.stderr.decode(errors='replace')}"


#: How long a rank's interpreter may take to start and import torch before its own bounds count.
START_BOUND = 120.0


@dataclass
class Rank:
    proc: subprocess.Popen[bytes]
    out: Path
    log: Path
    name: str

    def wait_started(self) -> bool:
        """Wait until the rank reached its code (``.started``: after its interpreter imported torch, which alone
        takes tens of seconds on a loaded machine), at most :data:`START_BOUND` s; whether it did."""
        started = Path(str(self.out) + ".started")
        end = time.monotonic() + START_BOUND
        while not started.exists() and self.proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        return started.exists()

    def exit_code(self, timeout: float) -> int:
        """The rank's exit status, ``timeout`` s at most from when it reached its code (:meth:`wait_started`).

        Counted from there, not from the launch: the interpreter's imports alone took over 30 s beside other
        work, and a rank that was to crash in the join was still importing torch when a launch-based bound ended.
        """
        self.wait_started()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"{self.name} still running after {timeout} s; log:\n{self.log.read_text()[-3000:]}"
            ) from None

    def result(self, timeout: float) -> dict[str, Any]:
        """The rank's result, ``timeout`` s at most from when it reached its code (:meth:`wait_started`)."""
        self.exit_code(timeout)
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
        after: Rank | None = None,
        call_again: bool = False,
        extra: dict[str, Any] | None = None,
        unset: Sequence[str] = (),
        hostname: str | None = None,
    ) -> Rank:
        name = name or f"rank{rank}-{len(self.ranks)}"
        out = self.tmp_path / f"{name}.json"
        log = self.tmp_path / f"{name}.log"
        spec = {
            "kwargs": kwargs or {},
            "start_after": start_after,
            "mode": mode,
            "hold": hold,
            "call_again": call_again,
            **(extra or {}),
        }
        if after is not None:  # start_after counts from the moment `after` calls init_with_retry
            spec["after_file"] = str(after.out) + ".started"
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "PMIX_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
        }
        environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR=addr,
            MASTER_PORT=str(port),
            PYTHONWARNINGS="ignore",
            TORCH_CPP_LOG_LEVEL="ERROR",
        )
        environ.update(env or {})
        for name in unset:  # a variable the launcher under test would not set
            environ.pop(name, None)
        cmd = [*prefix, sys.executable, str(WORKER), json.dumps(spec), str(out)]
        with log.open("wb") as fh:
            proc = popen(cmd, env=environ, stdout=fh, stderr=subprocess.STDOUT, hostname=hostname)
        handle = Rank(proc, out, log, name)
        self.ranks.append(handle)
        return handle

    def stop_all(self) -> None:
        for handle in self.ranks:
            if handle.proc.poll() is None:
                handle.proc.kill()
                handle.proc.wait(timeout=10)


class NetNs:
    """A network namespace of our own with only ``lo`` up, a resolver pointing at its own loopback, and
    optional nftables output rules. Root only; removed on close."""

    def __init__(self, name: str, *, rules: Sequence[str] = ()) -> None:
        self.name = name
        self.has_table = False
        self.resolv_dir = Path("/etc/netns") / name
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
        try:
            subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=10)
            self.resolv_dir.mkdir(parents=True, exist_ok=True)
            # ip-netns bind-mounts this over /etc/resolv.conf: lookups fail at once, locally.
            (self.resolv_dir / "resolv.conf").write_text("nameserver 127.0.0.1\n")
            if rules:
                self.nft("add table inet distinit")
                self.nft("add chain inet distinit out { type filter hook output priority 0; }")
                self.has_table = True
                for rule in rules:
                    self.nft(f"add rule inet distinit out {rule}")
        except BaseException:
            self.close()
            raise

    def nft(self, command: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.name, "nft", command], check=True, timeout=10)

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, timeout=10)

    def link(self, other: NetNs, *, subnet: str = "10.254.0", loss_percent: int = 0) -> tuple[str, str]:
        """Join this namespace and ``other`` with a veth pair (``<subnet>.1`` here, ``<subnet>.2`` there).

        ``loss_percent`` drops that share of the packets leaving through the link, in both directions: a
        lossy network *between* two hosts, while each side's own loopback stays clean. Returns the two
        interface names (this side's, the other side's). The pair goes away with either namespace.

        The loss is a fixed pattern (:func:`loss_slots`: every packet whose number through the rule falls on
        a slot), not ``numgen random``: random loss drops the same SYN or segment several times in a row now
        and then, and TCP's doubling retransmission timer (1, 2, 4, 8, 16 s) turned that luck into run times
        from 5 s to over 60 s (issue 34). With slots spread apart, no two consecutive packets on the link are
        dropped: the same share of loss, every run alike.
        """
        mine, theirs = "dveth0", "dveth1"
        subprocess.run(
            [
                "ip",
                "link",
                "add",
                mine,
                "netns",
                self.name,
                "type",
                "veth",
                "peer",
                "name",
                theirs,
                "netns",
                other.name,
            ],
            check=True,
            timeout=10,
        )
        for ns, ifname, host in ((self, mine, 1), (other, theirs, 2)):
            ns.ip("addr", "add", f"{subnet}.{host}/24", "dev", ifname)
            ns.ip("link", "set", ifname, "up")
            if loss_percent:
                if not ns.has_table:
                    ns.nft("add table inet distinit")
                    ns.nft("add chain inet distinit out { type filter hook output priority 0; }")
                    ns.has_table = True
                slots = ", ".join(map(str, loss_slots(loss_percent)))
                ns.nft(f'add rule inet distinit out oifname "{ifname}" numgen inc mod 100 {{ {slots} }} drop')
        return mine, theirs

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False, timeout=10)
        for child in (self.resolv_dir / "resolv.conf",):
            child.unlink(missing_ok=True)
        if self.resolv_dir.exists():
            self.resolv_dir.rmdir()


def loss_slots(percent: int) -> list[int]:
    """The ``percent`` packet numbers (of every 100) that a deterministic loss drops, spread evenly apart."""
    if not 0 < percent <= 50:
        raise ValueError(f"loss_percent={percent}: 1-50 (above 50 two consecutive packets would be dropped)")
    return sorted({round(i * 100 / percent) for i in range(percent)})


def netns_available() -> str | None:
    """None if network namespaces and nftables can be used here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` command (iproute2 / nftables)"
    return None


class HoldingListener:
    """A foreign program on a port of its own: accepts connections and holds them without a word."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = int(self.server.getsockname()[1])
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.held:
            conn.close()
        self.server.close()
