"""Network facts of this host, stdlib only: a classifying TCP probe, who holds a port, which addresses are ours.

A top-level leaf (no torch, no pydantic, nothing of ``distinit.init``), so that the torchrun backend's agents
(:mod:`distinit.rendezvous`) use the same probe and address rules as :func:`distinit.setup` without importing
``distinit.init``.

The probe: torch reports DNS failure, a refused connection and a black hole with the same "client socket has
timed out" text (measured on torch 2.13); this probe keeps the cause. It also speaks the first two messages of
the TCPStore protocol (VALIDATE, PING), so a foreign program listening on MASTER_PORT is recognised in
seconds instead of hanging torch's client without bound. Interfaces are read through the kernel's ioctls and
``/proc/net/if_inet6``, no ``ip`` subprocess.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import random
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

#: Result kinds: ``tcpstore`` (a TCPStore answered), ``foreign`` (TCP accepted, no TCPStore answer),
#: ``refused`` (nothing listens yet), ``dns`` (name does not resolve), ``unreachable`` (no route),
#: ``timeout`` (SYNs vanish: black hole), ``error`` (any other socket error).
ProbeKind = Literal["tcpstore", "foreign", "refused", "dns", "unreachable", "timeout", "error"]

# TCPStore wire protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp): QueryType is a uint8 enum,
# VALIDATE = 0 followed by the magic number, PING = 13 followed by a nonce the server echoes back.
# torch before 2.5 has no PING (2.1 and 2.4 checked): its server drops the connection at the unknown query, so a
# dropped handshake is tried again with GETNUMKEYS, which every torch answers with an int64 key count: after
# VALIDATE (GETNUMKEYS = 7, torch 2.2-2.4), then as torch 2.1 speaks (no VALIDATE, GETNUMKEYS = 6).
_VALIDATE = 0
_MAGIC = 0x3C85F7CE
_GETNUMKEYS = 7
_PING = 13
_OLDER = (struct.pack("=BIB", _VALIDATE, _MAGIC, _GETNUMKEYS), bytes([6]))
#: A key count above this is foreign bytes, not a store's answer.
_MOST_KEYS = 1 << 40

_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}

_SIOCGIFADDR = 0x8915
_IFNAMSIZ = 16
_INET6 = "/proc/net/if_inet6"


@dataclass(frozen=True)
class ProbeResult:
    """What one probe saw."""

    kind: ProbeKind
    detail: str
    elapsed: float


def probe(host: str, port: int, timeout: float, *, handshake_timeout: float = 3.0) -> ProbeResult:
    """Connect once to ``host:port`` within ``timeout`` seconds and classify the outcome. Never raises."""
    start = time.monotonic()

    def done(kind: ProbeKind, detail: str) -> ProbeResult:
        return ProbeResult(kind, detail, time.monotonic() - start)

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return done("dns", f"name resolution failed ({exc.strerror or exc})")
    except (UnicodeError, OSError) as exc:
        return done("dns", f"name resolution failed ({exc})")
    last: ProbeResult | None = None
    for family, kind, proto, _, address in infos:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            try:
                sock.connect(address)
            except ConnectionRefusedError:
                last = done("refused", "connection refused: nothing listens on the port yet")
                continue
            except TimeoutError:
                last = done("timeout", f"no answer to connect within {left:.1f} s: packets vanish")
                continue
            except OSError as exc:
                if exc.errno in _UNREACHABLE:
                    last = done("unreachable", f"{os.strerror(exc.errno or 0)} (errno {exc.errno})")
                else:
                    last = done("error", f"connect failed: {exc}")
                continue
            seen = _handshake(sock, handshake_timeout, done)
        finally:
            sock.close()
        if seen.kind == "foreign" and seen.detail.startswith(_DROPPED):
            for query in _OLDER:
                older = _count_keys(query, (family, kind, proto), address, handshake_timeout, done)
                if older is not None:
                    return older
        return seen
    return last if last is not None else done("timeout", f"no answer within {timeout:.1f} s")


_Done = Callable[[ProbeKind, str], ProbeResult]


#: How a handshake's detail starts when the listener dropped the connection (an older store at our PING).
_DROPPED = ("the listener closed the connection", "the listener broke the store handshake")


def _count_keys(
    query: bytes, socket_args: tuple[int, int, int], address: Any, timeout: float, done: _Done
) -> ProbeResult | None:
    """The handshake of a TCPStore without PING (torch < 2.5): ``query`` asks for the key count; None if it fails."""
    family, kind, proto = socket_args
    sock = socket.socket(family, kind, proto)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.sendall(query)
        data = b""
        while len(data) < 8:
            chunk = sock.recv(8 - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    finally:
        sock.close()
    if not 0 <= struct.unpack("=q", data)[0] < _MOST_KEYS:
        return None
    return done("tcpstore", "a TCPStore answered (one without PING: torch < 2.5)")


def _handshake(sock: socket.socket, timeout: float, done: _Done) -> ProbeResult:
    nonce = random.getrandbits(32)
    try:
        sock.settimeout(timeout)
        sock.sendall(struct.pack("=BIBI", _VALIDATE, _MAGIC, _PING, nonce))
        data = b""
        while len(data) < 4:
            chunk = sock.recv(4 - len(data))
            if not chunk:
                return done("foreign", "the listener closed the connection without answering the store handshake")
            data += chunk
    except TimeoutError:
        return done("foreign", f"the listener accepted but did not answer the store handshake in {timeout:.1f} s")
    except OSError as exc:
        return done("foreign", f"the listener broke the store handshake ({exc})")
    if struct.unpack("=I", data)[0] != nonce:
        return done("foreign", "the listener answered the store handshake with foreign bytes")
    return done("tcpstore", "a TCPStore answered")


def port_holder(port: int) -> str | None:
    """Describe the local process listening on TCP ``port`` (``"pid 123 (cmd ...)"``), if it can be found.

    Reads ``/proc/net/tcp{,6}`` for the listening socket's inode and ``/proc/*/fd`` for its owner; returns
    ``None`` off Linux, in another network namespace, or without permission to read the owner's fds.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return "a process (owner not visible)"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    return f"pid {pid} ({_cmdline(pid)})"
            except OSError:
                continue
    return "a process whose owner is not visible from here"


def _cmdline(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text[:160] or "?"


def binds(ip: str) -> bool:
    """Whether a TCP socket can bind ``ip`` (an address of this host binds, in microseconds)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, 0))
        except OSError:
            return False
    return True


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (``127.0.0.0/8``, ``::1``, ``::ffff:127.x``); False if not an IP."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def interfaces() -> tuple[tuple[str, str], ...]:
    """This host's non-loopback interfaces with an address: ``(name, address)``, IPv4 first, then global IPv6."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return ()
    found = [(name, ip) for name in names if (ip := interface_ipv4(name)) is not None and not is_loopback(ip)]
    found.extend(_ipv6())
    return tuple(found)


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (through the kernel's ioctl), or None."""
    if not name or len(name.encode()) >= _IFNAMSIZ:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            raw = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])


def _ipv6() -> list[tuple[str, str]]:
    """Global-scope IPv6 addresses from ``/proc/net/if_inet6`` (``hex index prefix scope flags name``)."""
    found: list[tuple[str, str]] = []
    with contextlib.suppress(OSError), open(_INET6, encoding="ascii") as lines:
        for line in lines:
            fields = line.split()
            if len(fields) == 6 and fields[3] == "00":
                ip = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
                if not is_loopback(ip):
                    found.append((fields[5], ip))
    return found
