"""The ``route`` check: which interface reaches MASTER_ADDR, against the ``*_SOCKET_IFNAME`` variables."""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping

from distinit._foreign import first_line
from distinit.doctor import _netif
from distinit.doctor._model import Check
from distinit.env import DistEnv

#: Variables that pin the interface a library uses; gloo's and tensorpipe's take concrete names only.
VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def source_route(addr: str, port: int) -> tuple[str, str | None]:
    """(source address, interface) the kernel picks to reach ``addr``: a UDP connect(), no packet sent.

    Raises:
        OSError: ``addr`` does not resolve (``socket.gaierror``) or has no route (ENETUNREACH).
    """
    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as sock:
        sock.connect(sockaddr)
        source = str(sock.getsockname()[0])
    return source, _netif.owner_of(source)


def _concrete_problems(variable: str, value: str) -> list[str]:
    problems = []
    for name in (part.strip() for part in value.split(",")):
        if name.startswith(("^", "=")):
            problems.append(
                f"{variable}={value!r}: {name[0]!r} is NCCL syntax; gloo and tensorpipe take concrete names"
            )
        elif name not in _netif.names():
            problems.append(f"{variable}={value!r}: no interface {name!r} on this host")
        elif not _netif.is_up(name):
            problems.append(f"{variable}={value!r}: interface {name!r} is down")
        elif _netif.ipv4(name) is None:
            problems.append(f"{variable}={value!r}: interface {name!r} has no IPv4 address")
    return problems


def nccl_matches(value: str, available: list[str]) -> list[str]:
    """The interfaces NCCL would consider for ``NCCL_SOCKET_IFNAME=value`` (prefixes, ``^`` excludes, ``=`` exact)."""
    exclude = value.startswith("^")
    body = value[1:] if exclude else value
    exact = body.startswith("=")
    patterns = [p.strip() for p in (body[1:] if exact else body).split(",") if p.strip()]

    def matches(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [name for name in available if matches(name) != exclude]


def _nccl_problems(value: str) -> list[str]:
    usable = [n for n in nccl_matches(value, _netif.names()) if _netif.is_up(n) and _netif.ipv4(n)]
    if usable:
        return []
    return [f"NCCL_SOCKET_IFNAME={value!r} selects no interface that is up with an IPv4 address"]


def route_fix(problems: list[str], environ: Mapping[str, str], *, iface: str) -> str:
    """The fix for ``problems``, as the variables actually stand (never "unset" a variable that is unset)."""
    fixes = []
    for variable in VARIABLES:
        if environ.get(variable) and any(p.startswith(f"{variable}=") for p in problems):
            value = "<prefix, e.g. eth>" if variable == "NCCL_SOCKET_IFNAME" else iface
            fixes.append(f"`export {variable}={value}` (the interface of `ip -4 route get <MASTER_ADDR>`), or unset it")
    if any(p.startswith("MASTER_ADDR=") for p in problems):
        fixes.append("set MASTER_ADDR to an address of rank 0's host that this host routes to (`ip -4 route get`)")
    return "; ".join(fixes)


def check_route(env: DistEnv | None, environ: Mapping[str, str]) -> Check:
    """Interface problems of ``environ``'s ``*_SOCKET_IFNAME`` and the route to ``env.master_addr``."""
    problems: list[str] = []
    for variable in VARIABLES:
        value = environ.get(variable)
        if value:
            problems += (
                _nccl_problems(value) if variable == "NCCL_SOCKET_IFNAME" else _concrete_problems(variable, value)
            )
    evidence: dict[str, object] = {v: environ[v] for v in VARIABLES if environ.get(v)}
    fix_iface = "<interface of `ip -4 route get MASTER_ADDR`>"
    if env is None or env.master_addr is None:
        if not problems:
            return Check(
                id="route", status="skip", summary="MASTER_ADDR unknown: nothing to route to", evidence=evidence
            )
    else:
        try:
            source, iface = source_route(env.master_addr, env.master_port or 9)
        except OSError as exc:
            why = "no route" if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH) else first_line(exc)
            problems.append(f"MASTER_ADDR={env.master_addr!r}: {why}")
        else:
            evidence.update(master_addr=env.master_addr, source=source, interface=iface)
            fix_iface = iface or fix_iface
            gloo = [n.strip() for n in environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
            if gloo and iface and iface != "lo" and iface not in gloo and not problems:
                return Check(
                    id="route",
                    status="warn",
                    summary=f"MASTER_ADDR={env.master_addr!r} is reached through {iface} ({source}) but "
                    f"GLOO_SOCKET_IFNAME={environ['GLOO_SOCKET_IFNAME']!r}",
                    fix=f"check that the hosts reach each other there, or `export GLOO_SOCKET_IFNAME={iface}`",
                    evidence=evidence,
                )
    if problems:
        return Check(
            id="route",
            status="fail",
            summary="; ".join(problems),
            fix=route_fix(problems, environ, iface=fix_iface),
            evidence={**evidence, "problems": problems},
        )
    shown = f"{evidence.get('interface')} ({evidence.get('source')})"
    return Check(id="route", status="pass", summary=f"MASTER_ADDR is reached through {shown}", evidence=evidence)
