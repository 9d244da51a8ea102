"""Local, instant checks before any network traffic; every failure here is a misconfiguration (never retried)."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping

import torch.distributed as dist

from distinit._net import interfaces
from distinit.env import DistEnv, check_port, master_addr_fix
from distinit.errors import IncompleteEnvError
from distinit.init import _loopback, _messages

#: A Slurm hostlist (``dnode[1-2]``, ``dnode[01,03]``) or a comma-separated list of hosts; an IPv6
#: literal in brackets (``[::1]``) holds colons, never only digits, commas and dashes.
_HOSTLIST = re.compile(r"\[[0-9][0-9,\-]*\]|,")

_IFNAME_VARIABLES = {"gloo": ("GLOO_SOCKET_IFNAME",), "nccl": ("NCCL_SOCKET_IFNAME",)}


def check_world(*, rank: int, world_size: int) -> None:
    """``0 <= rank < world_size``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise _messages.rank_out_of_range(rank=rank, world_size=world_size)


def check_master(
    *, master_addr: str | None, master_port: int | None, world_size: int, rank: int, launcher: str = "env"
) -> None:
    """MASTER_ADDR/MASTER_PORT present (for a world of more than one), the port in range, one host.

    The fix for a missing variable is worded in ``launcher``'s own way (``mpirun -x MASTER_ADDR=...``).
    """
    if world_size == 1:
        return
    missing = tuple(name for name, value in (("MASTER_ADDR", master_addr), ("MASTER_PORT", master_port)) if not value)
    if missing:
        raise IncompleteEnvError(
            f"rank {rank}: {' and '.join(missing)} not known, so there is no rendezvous endpoint for a world of "
            f"{world_size}.",
            variables=missing,
            why="the launcher did not export them and they were not set in the job script.",
            fix=f"{master_addr_fix(launcher)[:-1]}; give MASTER_PORT (a free port, one per job) the same way; or "
            "launch with torchrun/srun so distinit.env_from_scheduler() derives them.",
        )
    if master_port is not None:
        check_port(master_port, where=f" (rank {rank})")
    if master_addr and _HOSTLIST.search(master_addr):
        raise _messages.hostlist_addr(addr=master_addr, rank=rank)


def check_backend(backend: str, *, rank: int) -> None:
    """Check that torch provides ``backend`` in this build on this host."""
    available = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    if backend in available and not available[backend]:
        raise _messages.backend_unavailable(backend=backend, rank=rank)
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise _messages.backend_unavailable(backend=backend, rank=rank)


def check_interfaces(backend: str, environ: Mapping[str, str], *, rank: int) -> None:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` name interfaces that exist here.

    NCCL also accepts ``^name`` (exclude) and ``=name`` (exact) forms and prefixes; only plain names that
    match no interface prefix are rejected, so valid NCCL syntax never fails here.
    """
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return
    for variable in _IFNAME_VARIABLES.get(backend, ()):
        value = environ.get(variable)
        if not value:
            continue
        for item in value.split(","):
            item = item.strip()
            if not item or item.startswith("^"):
                continue
            exact = item.startswith("=")
            wanted = item.lstrip("=")
            ok = wanted in names if (exact or backend == "gloo") else any(n.startswith(wanted) for n in names)
            if not ok:
                raise _messages.bad_interface(variable=variable, value=value, available=names, rank=rank)


def check_advertised_address(backend: str, world: DistEnv, environ: Mapping[str, str]) -> None:
    """Refuse a world spanning hosts where gloo would advertise a loopback address (the 127.0.1.1 hostname trap).

    Checked only for gloo with ``GLOO_SOCKET_IFNAME`` unset (an explicit choice is the user's), and only
    when the hostname resolves to loopback (one lookup, which gloo makes anyway). "Spans hosts" is
    :func:`~distinit.init._loopback.spans_hosts`: a loopback MASTER_ADDR or a launcher that puts the whole
    world on one node is never an alarm. An error rather than a warning: the advertised address is
    unreachable from every other host, so init fails, or works only while every peer's address happens to
    sort below 127.x (gloo's connect order), and breaks once one does not.

    Raises:
        RendezvousError: gloo would advertise loopback in a world that spans hosts (names the fix).
    """
    if backend != "gloo" or world.world_size == 1 or environ.get("GLOO_SOCKET_IFNAME"):
        return
    advertised = _loopback.advertised_by_hostname(socket.gethostname())
    if not advertised.loopback:
        return
    evidence = _loopback.world_spans_hosts(world)
    if evidence is None:
        return
    raise _messages.loopback_advertised(
        rank=world.rank,
        hostname=advertised.hostname,
        resolved=advertised.resolved,
        address=advertised.address,
        evidence=evidence,
        fix=_messages.loopback_fix(
            host=advertised.hostname,
            route=_loopback.route_interface(world.master_addr, world.master_port),
            interfaces=interfaces(),
        ),
    )


def check_existing(*, backend: str, rank: int, world_size: int) -> bool:
    """True if a compatible default group already exists; raises if an incompatible one does."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    have_backend = str(dist.get_backend())
    have = f"backend {have_backend!r}, rank {dist.get_rank()} of {dist.get_world_size()}"
    want = f"backend {backend!r}, rank {rank} of {world_size}"
    if dist.get_rank() != rank or dist.get_world_size() != world_size or backend not in have_backend:
        raise _messages.incompatible_group(want=want, have=have, rank=rank)
    return True
