"""gloo's advertised address and the loopback trap: what this host would advertise, and whether it can work.

With ``GLOO_SOCKET_IFNAME`` unset, torch 2.13 gives gloo this machine's hostname, and gloo advertises the
first address of ``getaddrinfo(gethostname())`` that binds (torch's ``doesHostnameResolveToUsableAddress``,
gloo's ``lookupAddrForHostname``); when none does, torch falls back to ``127.0.0.1``. Debian and Ubuntu write
``127.0.1.1 <hostname>`` to ``/etc/hosts``, so such a host advertises a loopback address. For each pair of
ranks gloo makes the side with the larger address (then port) connect: a peer on another host told to
connect to ``127.0.1.1`` reaches its own loopback and fails at once (``Gloo connectFullMesh failed with
[...] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:PORT``), while the advertising
rank waits for a connection that never comes (measured on torch 2.13: about five times its timeout, then
``Connect timeout [none]``). On one host loopback is fine, so the trap matters only when the world spans
hosts (:func:`spans_hosts`).

The host's addresses and interfaces come from :mod:`distinit._net`.

Its parts: what this host would advertise (:func:`advertised`, :func:`spans_hosts`, :func:`loopback_remote`),
and the preflight (:func:`preflight` and the ``check_*`` functions): local, instant checks before any network
traffic, where every failure is a misconfiguration, never retried.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch.distributed as dist

from distinit._net import binds, interface_ipv4, interfaces, is_loopback
from distinit._port import check_port, master_addr_fix
from distinit.env import DistEnv
from distinit.errors import IncompleteEnvError
from distinit.init import _messages

#: torch's fallback when the hostname resolves to no address that binds (ProcessGroupGloo.cpp).
TORCH_FALLBACK = "127.0.0.1"
#: gloo's connect failure names the peer as ``remote=[ADDRESS]:PORT`` (IPv6 too, in brackets).
_REMOTE = re.compile(r"remote=\[([0-9A-Fa-f:.]+)\]:(\d+)")


@dataclass(frozen=True)
class Advertised:
    """What gloo would advertise to its peers from this host, and how it came to that address."""

    hostname: str
    resolved: tuple[str, ...]  # every address the hostname resolves to, in getaddrinfo order
    address: str  # the address gloo would advertise
    source: str  # how: "hostname", "fallback" (torch's 127.0.0.1) or "GLOO_SOCKET_IFNAME='lo'"

    @property
    def loopback(self) -> bool:
        """Whether the advertised address is a loopback address."""
        return is_loopback(self.address)


def choose_address(resolved: Sequence[str], binds: Callable[[str], bool]) -> tuple[str, str]:
    """Gloo's choice among ``resolved``: the first that ``binds``, else torch's fallback; (address, source). Pure."""
    for address in resolved:
        if binds(address):
            return address, "hostname"
    return TORCH_FALLBACK, "fallback"


def advertised_by_hostname(hostname: str) -> Advertised:
    """What gloo would advertise with ``GLOO_SOCKET_IFNAME`` unset (see the module docstring)."""
    try:
        infos = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        infos = []
    resolved = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    address, source = choose_address(resolved, binds)
    return Advertised(hostname=hostname, resolved=resolved, address=address, source=source)


def advertised(environ: Mapping[str, str]) -> Advertised | None:
    """What gloo would advertise here: from ``GLOO_SOCKET_IFNAME`` (its first interface) or the hostname.

    None when ``GLOO_SOCKET_IFNAME`` names an interface without an IPv4 address (init reports that itself).
    """
    value = environ.get("GLOO_SOCKET_IFNAME", "")
    hostname = socket.gethostname()
    if not value:
        return advertised_by_hostname(hostname)
    name = value.split(",")[0].strip()
    address = interface_ipv4(name)
    if address is None:
        return None
    return Advertised(hostname=hostname, resolved=(), address=address, source=f"GLOO_SOCKET_IFNAME={value!r}")


def spans_hosts(
    *,
    master_addr: str | None,
    master_ips: Sequence[str] | None,
    master_local: bool,
    num_nodes: int | None,
    local_world_size: int | None,
    world_size: int,
    nodes_from: Sequence[str] = (),
    local_from: Sequence[str] = (),
) -> str | None:
    """Why the world spans several hosts (the evidence, in words), or None when it may all be on this one. Pure.

    A MASTER_ADDR that resolves only to loopback means one host: every rank reaches the store through
    loopback (fake nodes, ``torchrun --standalone``). The launcher's word that the world is on one node
    wins next, so a NAT'd MASTER_ADDR on one machine is no alarm. Then the launcher's node count, a local
    world smaller than the world, or a MASTER_ADDR that is not an address of this host (rank 0 is elsewhere).
    """
    if master_ips and all(is_loopback(ip) for ip in master_ips):
        return None
    if num_nodes == 1 or local_world_size == world_size:
        return None
    if num_nodes is not None and num_nodes > 1:
        named = f", per {', '.join(nodes_from)}" if nodes_from else ""
        return f"the launcher says {num_nodes} nodes{named}"
    if local_world_size is not None and local_world_size < world_size:
        named = f", per {', '.join(local_from)}" if local_from else ""
        return f"only {local_world_size} of the {world_size} ranks run on this host{named}"
    if master_ips and not master_local:
        return f"MASTER_ADDR={master_addr!r} ({', '.join(master_ips[:3])}) is not an address of this host"
    return None


def world_spans_hosts(world: DistEnv) -> str | None:
    """:func:`spans_hosts` for ``world``, resolving MASTER_ADDR and testing whether it binds here."""
    ips: list[str] | None = None
    if world.master_addr:
        try:
            infos = socket.getaddrinfo(world.master_addr, None, type=socket.SOCK_STREAM)
            ips = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except (OSError, UnicodeError):
            ips = None  # init names a MASTER_ADDR that does not resolve itself
    return spans_hosts(
        master_addr=world.master_addr,
        master_ips=ips,
        master_local=any(binds(ip) for ip in ips or ()),
        num_nodes=world.num_nodes,
        local_world_size=world.local_world_size,
        world_size=world.world_size,
        nodes_from=world.sources.get("num_nodes", ()),
        local_from=world.sources.get("local_world_size", ()),
    )


def loopback_remote(text: str) -> str | None:
    """The loopback peer ``ADDRESS:PORT`` of a gloo ``connectFullMesh`` failure, or None. Pure.

    torch 2.13's text: ``Gloo connectFullMesh failed with [.../pair.cc:152] timed out connecting: SO_ERROR:
    Connection refused, remote=[127.0.1.1]:18311$1``.
    """
    if "connectFullMesh" not in text:
        return None
    found = _REMOTE.search(text)
    if found is None or not is_loopback(found.group(1)):
        return None
    return f"{found.group(1)}:{found.group(2)}"


def route_interface(master_addr: str | None, port: int | None) -> str | None:
    """The interface this host would use to reach ``master_addr`` (a UDP connect sends nothing), or None."""
    if not master_addr:
        return None
    try:
        family, _, _, _, target = socket.getaddrinfo(master_addr, port or 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            source = str(sock.getsockname()[0])
    except (OSError, UnicodeError, IndexError):
        return None
    return next((name for name, ip in interfaces() if ip == source), None)


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


def host_name_max() -> int:
    """``HOST_NAME_MAX`` as torch's gloo sizes its buffer with it (``sysconf(_SC_HOST_NAME_MAX)``; 64 on Linux)."""
    try:
        return int(os.sysconf("SC_HOST_NAME_MAX"))
    except (ValueError, OSError):
        return 64


def check_hostname(backend: str, world: DistEnv, environ: Mapping[str, str], *, hostname: str | None = None) -> None:
    """With ``GLOO_SOCKET_IFNAME`` unset, torch's gloo must be able to read this host's name.

    torch's ``createDefaultDevice`` calls ``gethostname()`` into a ``HOST_NAME_MAX``-byte buffer, so a name of
    exactly that many bytes (the kernel's own limit) fails every init with ``File name too long``.

    Raises:
        RendezvousError: the host name does not fit (names the interface to set instead).
    """
    if backend != "gloo" or environ.get("GLOO_SOCKET_IFNAME"):
        return
    name = socket.gethostname() if hostname is None else hostname
    limit = host_name_max()
    if len(name.encode()) < limit:
        return
    raise _messages.hostname_too_long(
        rank=world.rank,
        hostname=name,
        limit=limit,
        fix=_messages.loopback_fix(
            host=name,
            route=route_interface(world.master_addr, world.master_port),
            interfaces=interfaces(),
            instead=f"give this host a name shorter than {limit} bytes",
        ),
    )


#: A loopback address gloo would advertise in a world that spans hosts: what it is, and the evidence.
Trap = tuple[Advertised, str]


def loopback_trap(backend: str, world: DistEnv, environ: Mapping[str, str]) -> Trap | None:
    """Whether gloo would advertise a loopback address here in a world that spans hosts (see the module docstring).

    From ``GLOO_SOCKET_IFNAME`` when set, else the hostname (one lookup, which gloo makes anyway). "Spans
    hosts" is :func:`spans_hosts`: a loopback MASTER_ADDR or a launcher that puts the whole world on one node
    is never an alarm.
    """
    if backend != "gloo" or world.world_size == 1:
        return None
    address = advertised(environ)
    if address is None or not address.loopback:
        return None
    evidence = world_spans_hosts(world)
    return None if evidence is None else (address, evidence)


def check_advertised_address(
    backend: str, world: DistEnv, environ: Mapping[str, str], *, trap: Trap | bool | None = True
) -> None:
    """Refuse a world spanning hosts where gloo would advertise a loopback address (the 127.0.1.1 hostname trap).

    Checked only with ``GLOO_SOCKET_IFNAME`` unset (an explicit choice is the user's; the rendezvous then
    watches for the trap during init instead). ``trap``: :func:`loopback_trap`'s answer when the caller has
    it already (True: look it up here). An error rather than a warning: the advertised address is
    unreachable from every other host, so init fails, or works only while every peer's address happens to
    sort below 127.x (gloo's connect order), and breaks once one does not.

    Raises:
        RendezvousError: gloo would advertise loopback in a world that spans hosts (names the fix).
    """
    if environ.get("GLOO_SOCKET_IFNAME"):
        return
    found = loopback_trap(backend, world, environ) if trap is True else trap
    if not isinstance(found, tuple):
        return
    address, evidence = found
    raise _messages.loopback_advertised(
        rank=world.rank,
        hostname=address.hostname,
        resolved=address.resolved,
        address=address.address,
        evidence=evidence,
        fix=_messages.loopback_fix(
            host=address.hostname,
            route=route_interface(world.master_addr, world.master_port),
            interfaces=interfaces(),
        ),
    )


def preflight(backend: str, world: DistEnv, environ: Mapping[str, str]) -> Trap | None:
    """The local, instant checks before any network traffic, in order; the loopback trap gloo may meet here.

    The trap is looked up once: refused here when ``GLOO_SOCKET_IFNAME`` is unset, watched for during init
    when it names a loopback interface (see :func:`check_advertised_address`).

    Raises:
        SchedulerEnvError: MASTER_ADDR/MASTER_PORT missing or malformed.
        RendezvousError: an unavailable backend, a bad interface name, a host name gloo cannot read, or the
            loopback trap.
    """
    check_master(
        master_addr=world.master_addr,
        master_port=world.master_port,
        world_size=world.world_size,
        rank=world.rank,
        launcher=world.launcher,
    )
    check_backend(backend, rank=world.rank)
    check_interfaces(backend, environ, rank=world.rank)
    check_hostname(backend, world, environ)
    trap = loopback_trap(backend, world, environ)
    check_advertised_address(backend, world, environ, trap=trap)
    return trap


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
