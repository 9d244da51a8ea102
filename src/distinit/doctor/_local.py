"""The local checks: each rank, no network, no collective (``env limits shm host names route gpu``)."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable, Mapping

from distinit._identity import HostIdentity
from distinit.doctor._bound import bounded
from distinit.doctor._model import Check, OnCheck, from_error
from distinit.doctor._route import check_route
from distinit.doctor._shm import check_shm
from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import RendezvousError, SchedulerEnvError

#: Sockets and descriptors beyond gloo's two per peer: the store, logs, libraries.
FD_MARGIN = 128
#: The longest a name lookup may take before ``names`` fails (the resolver's own default is 5 s x 2).
NAME_TIMEOUT = 5.0
NAMES_FIX = (
    "set MASTER_ADDR to rank 0's routable address and GLOO_SOCKET_IFNAME to the interface that "
    "carries it (gloo otherwise falls back to the loopback address); fix /etc/hosts"
)


#: Notes that ``setup()`` cannot resolve: the rendezvous endpoint. Every other note is an assumption that
#: ``setup()`` checks or derives once the group forms (the node rank from the hosts, the layout), and that the
#: world checks (``nodes``, ``consensus``) verify here: information, not a warning.
UNRESOLVED_NOTES = ("MASTER_ADDR is unknown", "MASTER_PORT is unknown")


def check_env(*, strict: bool, environ: Mapping[str, str]) -> tuple[DistEnv | None, Check]:
    """Resolve the world; a failure is the bad-environment verdict (exit 2)."""
    try:
        env = env_from_scheduler(dict(environ), strict=strict)
    except SchedulerEnvError as exc:
        return None, from_error("env", exc, fix="run `distinit env --explain` and fix the variables it names")
    summary = f"rank {env.rank} of {env.world_size} ({env.launcher}), local rank {env.local_rank}"
    evidence = env.model_dump(mode="json", include={"rank", "local_rank", "world_size", "local_world_size"})
    evidence.update(node_rank=env.node_rank, num_nodes=env.num_nodes, launcher=env.launcher, notes=list(env.notes))
    unresolved = [note for note in env.notes if note.startswith(UNRESOLVED_NOTES)]
    if unresolved:
        return env, Check(
            id="env",
            status="warn",
            summary=f"{summary}; {unresolved[0]}",
            fix="`distinit env --explain` lists every assumption; set the variables it names",
            ranks=(env.rank,),
            evidence=evidence,
        )
    noted = f"; {len(env.notes)} note(s), see `distinit env --explain`" if env.notes else ""
    return env, Check(id="env", status="pass", summary=summary + noted, evidence=evidence)


def _limit(which: int) -> int | None:
    soft = resource.getrlimit(which)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def check_limits(world_size: int) -> Check:
    """RLIMIT_NOFILE against gloo's ~2 sockets per peer; NPROC and MEMLOCK as evidence."""
    nofile, nproc, memlock = (
        _limit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_MEMLOCK)
    )
    need = 2 * world_size + FD_MARGIN
    evidence = {"nofile": nofile, "nproc": nproc, "memlock": memlock, "nofile_needed": need}
    shown = "unlimited" if nofile is None else str(nofile)
    if nofile is not None and nofile < need:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        raise_to = "unlimited" if hard == resource.RLIM_INFINITY else str(max(need, hard))
        return Check(
            id="limits",
            status="fail",
            summary=f"open files limit {nofile} < {need} (2 sockets per peer for {world_size} ranks + {FD_MARGIN})",
            fix=f"`ulimit -n {raise_to}` before launching (Slurm: PropagateResourceLimits; docker: --ulimit nofile=)",
            evidence=evidence,
        )
    return Check(id="limits", status="pass", summary=f"open files {shown} >= {need}", evidence=evidence)


def check_host(identity: HostIdentity) -> Check:
    """This host's identity (evidence for ``nodes``); warns when the kernel's boot_id cannot be read."""
    evidence = identity.model_dump(mode="json")
    summary = f"{identity.hostname}, boot_id {(identity.boot_id or '?')[:8]}, /dev/shm {identity.shm_device}"
    if identity.boot_id is None:
        return Check(
            id="host",
            status="warn",
            summary=f"{summary}: /proc/sys/kernel/random/boot_id unreadable, hosts are told apart by name only",
            fix="mount /proc (or run outside this sandbox) so hosts can be told apart",
            evidence=evidence,
        )
    return Check(id="host", status="pass", summary=summary, evidence=evidence)


def _addresses(name: str) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)})


def multi_node(env: DistEnv) -> bool:
    """True when the world spans more than one node, as far as the environment says."""
    if env.num_nodes is not None:
        return env.num_nodes > 1
    return env.local_world_size is not None and env.local_world_size < env.world_size


def check_names(env: DistEnv | None, hostname: str, environ: Mapping[str, str]) -> Check:
    """The hostname and MASTER_ADDR resolve, and gloo would not advertise loopback in a world spanning hosts.

    The loopback rule is ``setup()``'s own (``distinit.init.check_advertised_address``): a
    named ``GLOO_SOCKET_IFNAME`` is the user's choice and never a ``names`` failure (``route`` checks it),
    and a loopback MASTER_ADDR or a one-node launcher means one host.
    """
    from distinit.init import check_advertised_address  # torch.distributed: the doctor has it

    problems: list[str] = []
    evidence: dict[str, object] = {"hostname": hostname}
    for label, name in (("hostname", hostname), ("MASTER_ADDR", env.master_addr if env else None)):
        if name is None:
            continue
        try:
            evidence[label] = _addresses(name)
        except (OSError, UnicodeError) as exc:
            problems.append(f"{label} {name!r} does not resolve ({getattr(exc, 'strerror', None) or exc})")
    if problems:
        return Check(id="names", status="fail", summary="; ".join(problems), fix=NAMES_FIX, evidence=evidence)
    if env is not None:
        try:
            check_advertised_address("gloo", env, environ)
        except RendezvousError as exc:
            return Check(
                id="names",
                status="fail",
                summary=str(exc).splitlines()[0],
                fix=exc.fix or NAMES_FIX,
                # a loopback-only problem: excused in the world report when every host shares one kernel
                evidence={**evidence, "loopback": ["hostname"], "problems": 1, "error": str(exc)},
            )
    return Check(id="names", status="pass", summary=f"{hostname} and MASTER_ADDR resolve", evidence=evidence)


def check_gpu(env: DistEnv | None, environ: Mapping[str, str]) -> Check:
    """Visible CUDA devices against LOCAL_RANK; ``skip`` on a machine without CUDA.

    A rank without a device of its own is a ``warn``, not a ``fail``: the doctor does not know the job's
    backend, and a gloo (CPU) job runs fine that way. An NCCL job does not: ``--nccl`` fails those ranks by
    name, and ``setup()`` without a backend refuses such a host before it joins.
    """
    import torch  # only here: the other local checks stay torch-free

    if not torch.cuda.is_available():
        return Check(id="gpu", status="skip", summary="no CUDA device visible (torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    evidence: dict[str, object] = {"device_count": count, "CUDA_VISIBLE_DEVICES": visible}
    local_rank = env.local_rank if env else 0
    if local_rank >= count:
        return Check(
            id="gpu",
            status="warn",
            summary=f"LOCAL_RANK={local_rank} but only {count} device(s) visible (CUDA_VISIBLE_DEVICES={visible!r}): "
            "no GPU of its own (fine for a gloo job; NCCL fails)",
            fix="for a GPU job launch at most one rank per visible GPU, or fix CUDA_VISIBLE_DEVICES; for a CPU job "
            "name the backend (setup('gloo'))",
            evidence=evidence,
        )
    uuid = str(torch.cuda.get_device_properties(local_rank).uuid)
    evidence["uuid"] = uuid
    return Check(
        id="gpu", status="pass", summary=f"{count} device(s); local rank {local_rank} -> {uuid}", evidence=evidence
    )


def run_local(
    env: DistEnv | None,
    *,
    identity: HostIdentity,
    environ: Mapping[str, str],
    budget: Callable[[], float],
    skip: frozenset[str] = frozenset(),
    on_check: OnCheck | None = None,
) -> list[Check]:
    """Every local check after ``env``, each bounded by what is left of ``budget()`` (seconds).

    A check in ``skip`` is not run. ``on_check`` gets each verdict as soon as it is known.
    """
    world_size = env.world_size if env else 1
    local_world_size = (env.local_world_size or 1) if env else 1
    probes: list[tuple[str, Callable[[], Check], float, str]] = [
        ("limits", lambda: check_limits(world_size), 1.0, "getrlimit"),
        ("shm", lambda: check_shm(local_world_size=local_world_size), 2.0, "a scan of /dev/shm and /proc"),
        ("host", lambda: check_host(identity), 1.0, "/proc reads"),
        ("names", lambda: check_names(env, identity.hostname, environ), NAME_TIMEOUT, "the name resolver"),
        ("route", lambda: check_route(env, environ), NAME_TIMEOUT, "the name resolver (MASTER_ADDR)"),
        ("gpu", lambda: check_gpu(env, environ), 10.0, "the CUDA driver"),
    ]
    checks = []
    for check_id, probe, bound, waiting_for in probes:
        if check_id in skip:
            checks.append(Check(id=check_id, status="skip", summary="skipped (--skip)"))
        else:
            started = time.monotonic()
            check = bounded(check_id, probe, timeout=max(0.05, min(bound, budget())), waiting_for=waiting_for)
            took = round(time.monotonic() - started, 5)
            evidence = {**check.evidence, "elapsed_s": took}
            checks.append(Check.model_validate({**check.model_dump(), "evidence": evidence}))
        if on_check is not None:
            on_check(checks[-1])
    return checks
