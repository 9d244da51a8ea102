"""The rendezvous store: rank 0 hosts one TCPStore for the whole deadline; the others connect with bounds.

torch's TCPStore client retries connect+validate around a socket connect that itself retries, so one
client constructor can take 1.8-2.7x its timeout, and a foreign listener that accepts and holds blocks it
without bound (measured on torch 2.13). Clients therefore only construct a TCPStore after
:func:`distinit._net.probe` saw a TCPStore answer, and the constructor runs in a helper thread
joined with a bound.

The host serves on an IPv4-only listening socket when MASTER_ADDR has only IPv4 addresses. torch's own
listener is dual-stack, so every peer appears to it as ``::ffff:a.b.c.d``, and the store's thread looks that
name up (``getnameinfo``) on each connection: ``/etc/hosts`` cannot answer an IPv4-mapped address, so each
lookup goes to DNS, one after another on that thread, and one dropped query stalls every connect behind it
for the resolver's 5 s timeout (measured: 64 loopback clients 10.1 s with torch's listener, 5.0 s at most
and a p50 of 3-8 ms with the IPv4 one; the rest of the stalls are the clients' own lookups, see
docs/scale.md). With an IPv4 listener the peer is ``a.b.c.d``, which ``/etc/hosts`` answers.
"""

from __future__ import annotations

import errno
import socket
import threading

import torch.distributed as dist
from torch.distributed import TCPStore

from distinit._duration import to_timedelta, wait_bound
from distinit.init._attempt import AttemptFailed, quote

_BUSY_MARKERS = ("EADDRINUSE", "Address already in use", "errno: 98")


def is_port_busy(exc: BaseException) -> bool:
    """Whether a TCPStore server error means the port is taken (libuv and legacy wording)."""
    text = str(exc)
    return any(marker in text for marker in _BUSY_MARKERS)


def host_store(host: str, port: int, *, timeout: float) -> TCPStore:
    """Bind and serve the TCPStore on ``port`` (rank 0). Never waits for workers.

    Raises:
        AttemptFailed: (kind ``port_busy``) the port is held by someone else; (kind ``store``) other failures.
    """
    listener = _ipv4_listener(host, port)
    try:
        # multi_tenant: if this process still serves the port (a store that outlived teardown), reuse it.
        return TCPStore(
            host,
            port if listener is None else listener[1],
            is_master=True,
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=None if listener is None else listener[0],
            timeout=to_timedelta(max(timeout, 0.1)),
        )
    except (dist.DistError, RuntimeError) as exc:
        if listener is not None:
            _close_listener(*listener)
        if is_port_busy(exc):
            raise AttemptFailed("port_busy", f"cannot bind MASTER_PORT={port}: address already in use") from exc
        raise AttemptFailed("store", f"cannot host the store on port {port}: {quote(exc)}") from exc


def _ipv4_listener(host: str, port: int) -> tuple[int, int] | None:
    """A listening IPv4 socket on ``port`` (all interfaces, as torch's) as (fd, port), handed to the store.

    None -- torch then listens itself, dual-stack -- when ``host`` has an IPv6 address (a client would find
    nobody there) or the port is taken (torch's own bind reuses this process's store, or says it is busy).
    """
    try:
        families = {info[0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return None
    if families != {socket.AF_INET}:
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's listener: TIME_WAIT is no owner
        sock.bind(("0.0.0.0", port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise AttemptFailed("store", f"cannot listen on port {port}: {quote(exc)}") from exc
        return None
    bound = int(sock.getsockname()[1])
    return sock.detach(), bound  # the store owns the descriptor from now on


def _close_listener(fd: int, port: int) -> None:
    """Close our listener after a failed store start, unless torch closed it already (a reused number)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return  # closed by the store's own clean-up
    if sock.family == socket.AF_INET and sock.getsockname()[1] == port:
        sock.close()
    else:
        sock.detach()  # the number now belongs to something else: leave it


def connect_store(host: str, port: int, *, timeout: float) -> TCPStore:
    """Connect a TCPStore client to ``host:port`` within about ``timeout`` seconds.

    Raises:
        AttemptFailed: (kind ``store``) the connection failed or did not complete in time.
    """
    bound = max(timeout, 0.1)
    box: dict[str, object] = {}

    def build() -> None:
        try:
            box["store"] = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=to_timedelta(bound))
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    # The native constructor cannot be interrupted; if it outlives its bound the daemon thread is left
    # behind (it ends when the peer closes or the process exits) and the attempt fails.
    thread = threading.Thread(target=build, name="distinit-store-connect", daemon=True)
    thread.start()
    thread.join(wait_bound(bound + 2.0))
    if thread.is_alive():
        raise AttemptFailed("store", f"the store handshake with {host}:{port} did not complete in {bound:.1f} s")
    error = box.get("error")
    if isinstance(error, BaseException):
        raise AttemptFailed("store", f"cannot connect to the store at {host}:{port}: {quote(error)}") from error
    store = box["store"]
    if not isinstance(store, TCPStore):
        raise AttemptFailed("store", "the store connection returned no store")
    return store
