"""Network interfaces through the kernel's ioctls (stdlib only, no ``ip`` subprocess): names, up, IPv4."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFNAMSIZ = 16


def names() -> list[str]:
    """Every interface of this network namespace."""
    return [name for _, name in socket.if_nameindex()]


def _ioctl(name: str, request: int) -> bytes | None:
    if not name or len(name.encode()) >= _IFNAMSIZ:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()))
        except OSError:
            return None


def is_up(name: str) -> bool:
    """The interface exists and is administratively up."""
    raw = _ioctl(name, _SIOCGIFFLAGS)
    return raw is not None and bool(struct.unpack_from("H", raw, _IFNAMSIZ)[0] & _IFF_UP)


def ipv4(name: str) -> str | None:
    """The interface's IPv4 address, or None (absent, or no address)."""
    raw = _ioctl(name, _SIOCGIFADDR)
    return None if raw is None else socket.inet_ntoa(raw[20:24])


def owner_of(address: str) -> str | None:
    """The interface holding ``address`` (``lo`` for any loopback address), or None."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return "lo" if "lo" in names() else None
    except ValueError:
        return None
    return next((name for name in names() if ipv4(name) == address), None)
