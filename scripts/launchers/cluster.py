#!/usr/bin/env python3
"""A throw-away Slurm 22.05 cluster on one machine, for distinit's real-launcher tests.

Starts (when none answers) a ``munged`` running as user ``munge``, then one ``slurmctld`` and N
``slurmd -N <name>`` daemons that emulate N nodes on this host. Everything lives in one work
directory: its own ``slurm.conf`` (clients find it through ``SLURM_CONF``, never ``/etc/slurm``),
state, spool and logs. Ports are picked free at start, away from Slurm's defaults and from the
ports other sessions on a shared machine use (6817/6818, 16817, 17001-17003). Node names
(``dnode1``..) resolve to 127.0.0.1 through ``/etc/hosts``; entries are added only when missing
and only as root. Each node declares more CPUs than the machine has
(``SlurmdParameters=config_overrides``) so ``srun -n 4`` runs instead of queueing forever.

Every process started is recorded in ``<workdir>/state.json`` (pid + command line) and stopped by
pid, after checking that the pid still runs that command line. With ``owner`` (a pid: the test session),
a guard process waits for that process to end (on a pidfd, not a clock) and then stops the cluster, so
the daemons never outlive a session that was killed before its teardown ran (SIGTERM, a CI timeout).
A ``munged`` this script did not start is never stopped; one it started is left running while other
Slurm daemons on the machine (another session's cluster) still need it.

Usage::

    cluster.py start --workdir DIR [--nodes 3] [--cpus 8] [--owner PID]   # prints the state as JSON
    cluster.py stop --workdir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MUNGE_KEY = Path("/etc/munge/munge.key")
AVOID_PORTS = {6817, 6818, 16817, 17001, 17002, 17003}
#: Below every port a job of the tests may pick: distinit's derived MASTER_PORTs (20000-32767,
#: ``distinit._port.DERIVED_PORTS``), Lightning's Slurm default (15000 + the job id's last 4 digits), torch's 29500
#: and the kernel's ephemeral range (32768-60999). It was 27100-29900: a derived port met the emulated node's
#: slurmd (dnode2 on 27102), which accepts the store's connection and never answers, so ``slurm-het-component``'s
#: rank 1 failed with "something is listening ... not a torch TCPStore" (a clean-clone run of issue 34).
PORT_RANGE = range(8100, 9900, 10)
DAEMONS = ("munged", "slurmctld", "slurmd")
NODE_PREFIX = "dnode"


@dataclass
class Proc:
    """One daemon this script started."""

    name: str
    pid: int
    cmdline: list[str]


@dataclass
class Cluster:
    """What the tests need to use the cluster: the config path, node names, the client env."""

    workdir: str
    slurm_conf: str
    nodes: list[str]
    cpus: int
    ctld_port: int
    node_ports: list[int]
    procs: list[Proc] = field(default_factory=list)

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Return an environment for Slurm clients (srun, sbatch, salloc, sinfo)."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.slurm_conf
        return env


def missing_binaries() -> list[str]:
    """Return the Slurm/munge binaries that are not installed."""
    names = ["munged", "munge", "unmunge", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "sinfo"]
    found = []
    for name in names:
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists():
            found.append(name)
    return found


def _binary(name: str) -> str:
    path = shutil.which(name) or str(Path("/usr/sbin", name))
    if not Path(path).exists():
        raise FileNotFoundError(f"{name} is not installed (run scripts/install-system-deps.sh as root)")
    return path


def _munge_works() -> bool:
    if not MUNGE_SOCKET.exists():
        return False
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=True).stdout
        subprocess.run(["unmunge"], input=cred, capture_output=True, timeout=10, check=True)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


def _ensure_munge(workdir: Path) -> Proc | None:
    """Start munged as user munge unless one already answers; return it when we started it."""
    if _munge_works():
        return None
    import pwd

    pw = pwd.getpwnam("munge")
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(os.urandom(128))
    os.chown(MUNGE_KEY, pw.pw_uid, pw.pw_gid)
    os.chmod(MUNGE_KEY, 0o400)
    for d in (Path("/run/munge"), Path("/var/lib/munge"), Path("/var/log/munge")):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    cmd = [_binary("munged"), "--foreground", "--force"]
    log = open(workdir / "munged.out", "ab")  # noqa: SIM115 - handed to the daemon
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, user=pw.pw_uid, group=pw.pw_gid, start_new_session=True
    )
    log.close()
    deadline = time.monotonic() + 20
    while not _munge_works():
        if proc.poll() is not None:
            raise RuntimeError(f"munged exited with {proc.returncode}; see {workdir / 'munged.out'}")
        if time.monotonic() > deadline:
            _stop_pid(Proc("munged", proc.pid, cmd))
            raise RuntimeError("munged did not answer within 20 s")
        time.sleep(0.1)
    return Proc("munged", proc.pid, cmd)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _pick_ports(count: int) -> list[int]:
    for base in PORT_RANGE:
        ports = list(range(base, base + count))
        if AVOID_PORTS.isdisjoint(ports) and all(_port_free(p) for p in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports in {PORT_RANGE}")


def _ensure_hosts(nodes: Sequence[str]) -> None:
    """Make every node name resolve to 127.0.0.1 (adds /etc/hosts lines when root and missing)."""
    missing = []
    for node in nodes:
        try:
            addr = socket.gethostbyname(node)
        except OSError:
            missing.append(node)
            continue
        if not addr.startswith("127."):
            raise RuntimeError(f"node name {node} resolves to {addr}, not loopback; pick another prefix")
    if not missing:
        return
    if os.geteuid() != 0:
        raise PermissionError(f"{', '.join(missing)} do not resolve and only root may add them to /etc/hosts")
    with open("/etc/hosts", "a", encoding="utf-8") as f:
        f.write(f"127.0.0.1 {' '.join(missing)}  # distinit launcher tests\n")


def _write_conf(
    workdir: Path, nodes: Sequence[str], cpus: int, ctld_port: int, node_ports: Sequence[int], first_job_id: int = 1
) -> Path:
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "log"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        for n, p in zip(nodes, node_ports, strict=True)
    )
    conf = f"""# distinit launcher-test cluster (generated by scripts/launchers/cluster.py)
ClusterName=distinit
FirstJobId={first_job_id}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={node_ports[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd.%n.pid
SlurmctldLogFile={workdir}/log/slurmctld.log
SlurmdLogFile={workdir}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# Heterogeneous jobs start only from the backfill pass; its default 30 s interval made them wait.
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MailProg=/bin/true
PropagateResourceLimits=NONE
InactiveLimit=0
KillWait=5
# sbatch --wait sleeps 2 s, then x4 while below MinJobAge/2 (2, 8, 32 s: 42 s for a 1 s job); 4 keeps it at 2 s.
MinJobAge=4
SlurmdTimeout=60
# srun --mpi=pmix: each node's stepd makes $TmpFS/spmix_appdir_<uid>_<job>.<step>; emulated nodes
# share one /tmp, so the second node failed with "File exists". TmpFS expands %n (mpi.conf's
# PMIxCliTmpDirBase does not).
TmpFS={workdir}/tmp/%n
{node_lines}
PartitionName=debug Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""
    path = workdir / "slurm.conf"
    path.write_text(conf, encoding="utf-8")
    for n in nodes:
        (workdir / "tmp" / n).mkdir(parents=True, exist_ok=True)
    return path


#: The daemons this process started, by pid, with their output files: a daemon that ends during the start is
#: reported with how it ended (its exit status or the signal that killed it) and its last output.
_SPAWNED: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}


def _spawn(name: str, cmd: list[str], env: dict[str, str], log: Path) -> Proc:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
    _SPAWNED[proc.pid] = (proc, log)
    return Proc(name, proc.pid, cmd)


def _ended(p: Proc) -> str:
    """How daemon ``p`` (found not running) ended, as far as this process can tell, and its last output."""
    spawned = _SPAWNED.get(p.pid)
    if spawned is None:
        return f"{p.name} (pid {p.pid}) is not running"
    proc, log = spawned
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # alive, yet not running the command it was started with
        how = f"runs {_cmdline(p.pid)} instead of {p.cmdline}"
    else:
        how = f"exited with status {code}" if code >= 0 else f"was killed by signal {-code} ({signal.strsignal(-code)})"
    try:
        tail = log.read_bytes()[-800:].decode(errors="replace").strip()
    except OSError as exc:
        tail = f"(unreadable: {exc})"
    return f"{p.name} (pid {p.pid}) {how}; its output ends: {tail or '(nothing)'!r}"


def _wait_idle(cluster: Cluster, timeout: float) -> None:
    env = cluster.client_env()
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for p in cluster.procs:
            if not _alive(p):
                raise RuntimeError(f"{_ended(p)}; logs in {cluster.workdir}/log")
        try:
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True, timeout=10
            )
            last = out.stdout + out.stderr
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if all(states.get(n, "").startswith(("idle", "mix", "alloc")) for n in cluster.nodes):
                return
        except (subprocess.SubprocessError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nodes not idle after {timeout} s; last sinfo: {last.strip()!r}")


def start(
    workdir: Path,
    nodes: int = 3,
    cpus: int = 8,
    timeout: float = 60,
    first_job_id: int = 1,
    owner: int | None = None,
) -> Cluster:
    """Start munged (if needed), slurmctld and ``nodes`` slurmd daemons; return the cluster.

    Clusters running side by side need distinct ``first_job_id``s: distinit derives MASTER_PORT from
    SLURM_JOB_ID, so two clusters' job 1 would meet on one port of this one host. With ``owner`` (a pid), a
    guard stops the cluster when that process ends, whether or not it called :func:`stop`.
    """
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    names = [f"{NODE_PREFIX}{i}" for i in range(1, nodes + 1)]
    _ensure_hosts(names)
    ports = _pick_ports(nodes + 1)
    conf = _write_conf(workdir, names, cpus, ports[0], ports[1:], first_job_id)
    cluster = Cluster(str(workdir), str(conf), names, cpus, ports[0], ports[1:])
    env = cluster.client_env()
    try:
        munged = _ensure_munge(workdir)
        if munged is not None:
            cluster.procs.append(munged)
        _save(cluster)
        ctld = _spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(conf)], env, workdir / "slurmctld.out")
        cluster.procs.append(ctld)
        _save(cluster)
        for n in names:
            cmd = [_binary("slurmd"), "-D", "-N", n, "-f", str(conf)]
            cluster.procs.append(_spawn("slurmd", cmd, env, workdir / f"slurmd.{n}.out"))
            _save(cluster)
        if owner is not None:
            cmd = [sys.executable, str(Path(__file__).resolve()), "guard", "--workdir", str(workdir)]
            cluster.procs.append(_spawn("guard", [*cmd, "--owner", str(owner)], env, workdir / "guard.out"))
            _save(cluster)
        _wait_idle(cluster, timeout)
    except BaseException:
        stop(workdir)
        raise
    return cluster


def guard(workdir: Path, owner: int) -> None:
    """Wait for process ``owner`` to end, then stop the cluster in ``workdir`` (this guard excepted)."""
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:  # already gone
        pass
    else:
        select.select([fd], [], [])  # readable once the process has ended
        os.close(fd)
    stop(workdir)


def _save(cluster: Cluster) -> None:
    path = Path(cluster.workdir) / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cluster), indent=1), encoding="utf-8")
    tmp.replace(path)


def load(workdir: Path) -> Cluster:
    """Read a cluster's state file."""
    data = json.loads((workdir / "state.json").read_text(encoding="utf-8"))
    procs = [Proc(**p) for p in data.pop("procs")]
    return Cluster(**data, procs=procs)


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _alive(p: Proc) -> bool:
    """True when pid still runs the command we started (not a zombie, not a reused pid)."""
    cmd = _cmdline(p.pid)
    if not cmd or cmd != p.cmdline:
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{p.pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _stop_pid(p: Proc, grace: float = 5.0) -> None:
    if not _alive(p):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(p):
            return
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p.pid, os.WNOHANG)
        time.sleep(0.05)
    if _alive(p):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)


def stop(workdir: Path) -> None:
    """Stop, by pid, every daemon recorded in the work directory (slurmds first, munged last)."""
    try:
        cluster = load(workdir.resolve())
    except FileNotFoundError:
        return
    order = {"guard": -1, "slurmd": 0, "slurmctld": 1, "munged": 2}
    for p in sorted(cluster.procs, key=lambda q: order.get(q.name, 0)):
        if p.pid == os.getpid():  # the guard stopping the cluster it guards
            continue
        if p.name == "munged" and _others_use_munge({q.pid for q in cluster.procs}):
            # Another cluster on this machine (a concurrent test session) authenticates through the
            # munged we started; stopping it would break that session. It keeps running.
            print(f"cluster.py: leaving munged (pid {p.pid}) running: other Slurm daemons use it", file=sys.stderr)
            continue
        _stop_pid(p)


def _others_use_munge(ours: set[int]) -> bool:
    """True when a Slurm daemon we did not start is running (it needs munged)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        cmd = _cmdline(int(entry.name))
        if cmd and Path(cmd[0]).name in {"slurmctld", "slurmd"} and _alive(Proc("", int(entry.name), cmd)):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (start/stop/status)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "status", "guard"])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=8)
    parser.add_argument("--owner", type=int, help="stop the cluster when this pid ends (start, guard)")
    args = parser.parse_args(argv)
    if args.action == "start":
        cluster = start(args.workdir, args.nodes, args.cpus, owner=args.owner)
        print(json.dumps(asdict(cluster), indent=1))
    elif args.action == "stop":
        stop(args.workdir)
    elif args.action == "guard":
        if args.owner is None:
            parser.error("guard needs --owner")
        guard(args.workdir, args.owner)
    else:
        cluster = load(args.workdir.resolve())
        for p in cluster.procs:
            print(p.name, p.pid, "alive" if _alive(p) else "gone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
