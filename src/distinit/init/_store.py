"""The rendezvous store and its endpoint (:class:`Master`): rank 0 hosts it, the others probe and connect.

Rank 0 checks that MASTER_ADDR is this host, then binds and serves the store; the others probe the master
until a TCPStore answers, then connect with bounds; a failure that persists past its grace period becomes
its specific error (:func:`specific_error`). Its parts:

* :func:`host_store` and :func:`connect_store` -- the store itself: rank 0 hosts one TCPStore for the whole
  deadline, the others connect with bounds;
* :func:`specific_error` -- the cause of a failure that persisted, named, with the port's holder looked up;
* :func:`check_hosting_addr` -- is MASTER_ADDR this host? Rank 0 checks before hosting the store, so a
  wrong address fails at once;
* :func:`host`, :func:`connect` and :func:`escalate` -- reaching the store: rank 0 binds and serves it, the
  others probe the master until a TCPStore answers.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass

import torch
from torch.distributed import TCPStore

from distinit._duration import to_timedelta, wait_bound
from distinit._net import binds, port_holder, probe
from distinit.errors import RendezvousError
from distinit.init import _messages
from distinit.init._policy import AttemptFailed, FailureKind, Grace, Unsupported, nature, quote
from distinit.init._thread import Abandoned

logger = logging.getLogger("distinit.init")

_BUSY_MARKERS = ("EADDRINUSE", "Address already in use", "errno: 98")


def is_port_busy(exc: BaseException) -> bool:
    """Whether a TCPStore server error means the port is taken (libuv and legacy wording)."""
    text = str(exc)
    return any(marker in text for marker in _BUSY_MARKERS)


def host_store(host: str, port: int, *, timeout: float) -> TCPStore:
    """Bind and serve the TCPStore on ``port`` (rank 0). Never waits for workers.

    Raises:
        AttemptFailed: (kind ``port_busy``) the port is held by someone else; (kind ``store``) other failures
            that waiting may cure.
        Unsupported: no retry can cure it (:func:`~distinit.init._policy.nature`: a feature this torch lacks,
            an unknown keyword); the attempt loop turns it into the verdict.
    """
    listener = _ipv4_listener(host, port)
    try:
        return _serve(host, port, listener, timeout=timeout)
    except Exception as exc:
        if listener is not None:
            _close_listener(*listener)
        if is_port_busy(exc):
            raise AttemptFailed("port_busy", f"cannot bind MASTER_PORT={port}: address already in use") from exc
        if nature(exc) == "deterministic":
            raise Unsupported(f"host the store on port {port}", exc) from exc
        raise AttemptFailed("store", f"cannot host the store on port {port}: {quote(exc)}") from exc


class _Server:
    """Which TCPStore server takes our listening descriptor on this torch, learned once per process.

    torch 2.4 made the libuv server the default, and it refuses a pre-made listening socket with
    ``NotImplementedError`` ("... does not support initialization with an listen fd"); the legacy server
    (``use_libuv=False``) takes it (checked on 2.4.1). Newer torches take it with either server.
    """

    legacy = False


def _serve(host: str, port: int, listener: tuple[int, int] | None, *, timeout: float) -> TCPStore:
    """The store server: on our IPv4 listener if there is one (the legacy server where libuv refuses it)."""
    # multi_tenant: if this process still serves the port (a store that outlived teardown), reuse it.
    bound = to_timedelta(max(timeout, 0.1))
    if listener is None:
        return TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True, timeout=bound)
    fd, at = listener
    if not _Server.legacy:
        try:
            return TCPStore(
                host, at, is_master=True, wait_for_workers=False, multi_tenant=True, master_listen_fd=fd, timeout=bound
            )
        except NotImplementedError as exc:
            if "libuv" not in str(exc):
                raise
            _Server.legacy = True
            logger.info(
                "the libuv TCPStore server of torch %s cannot take a listening socket: rank 0 hosts the store "
                "with the legacy server (use_libuv=False) in this process",
                torch.__version__,
                extra={"distinit": {"event": "init.store_server", "server": "legacy", "torch": torch.__version__}},
            )
    return TCPStore(
        host,
        at,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=fd,
        use_libuv=False,
        timeout=bound,
    )


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
        Unsupported: the constructor failed in a way no retry cures.
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
    if isinstance(error, Exception) and nature(error) == "deterministic":
        raise Unsupported(f"connect to the store at {host}:{port}", error) from error
    if isinstance(error, BaseException):
        raise AttemptFailed("store", f"cannot connect to the store at {host}:{port}: {quote(error)}") from error
    store = box["store"]
    if not isinstance(store, TCPStore):
        raise AttemptFailed("store", "the store connection returned no store")
    return store


#: Failure kinds whose persistence has a specific error (the others end as ``RendezvousTimeoutError``).
SPECIFIC = ("dns", "unreachable", "timeout", "foreign", "port_busy")


@dataclass(frozen=True)
class Master:
    """The rendezvous endpoint as this rank sees it, and the rank (for the messages)."""

    addr: str
    port: int
    rank: int

    @property
    def name(self) -> str:
        """``addr:port``."""
        return f"{self.addr}:{self.port}"

    def is_local(self) -> bool:
        """Whether the master is this host (only then can the port's holder be looked up)."""
        return self.addr in ("127.0.0.1", "localhost", socket.gethostname())


def specific_error(failure: AttemptFailed, lasted: float, master: Master) -> RendezvousError:
    """The error for ``failure`` (one of :data:`SPECIFIC`) having lasted ``lasted`` seconds."""
    detail = failure.detail.split(": ", 1)[-1]
    if failure.kind == "dns":
        return _messages.cannot_resolve(
            master=master.name, host=master.addr, seconds=lasted, detail=detail, rank=master.rank
        )
    if failure.kind == "unreachable":
        return _messages.unroutable(master=master.name, seconds=lasted, detail=detail, rank=master.rank)
    if failure.kind == "timeout":
        return _messages.black_hole(master=master.name, seconds=lasted, rank=master.rank)
    if failure.kind == "port_busy":
        holder = port_holder(master.port)
        return _messages.port_in_use(
            master=master.name, port=master.port, seconds=lasted, holder=holder, rank=master.rank
        )
    holder = port_holder(master.port) if master.is_local() else None
    return _messages.foreign_listener(master=master.name, seconds=lasted, holder=holder, rank=master.rank)


# torch's store host also connects to MASTER_ADDR as a client; if MASTER_ADDR names another host, that
# connect is refused (or vanishes) until the deadline, and every other rank waits on a host where no store
# will ever run. So rank 0 resolves MASTER_ADDR and tries to bind each address (an address of this host
# binds); if none binds, it still accepts the address when a connection to it arrives at a listener of its
# own on MASTER_PORT (a NAT, a container's published port, a service address routed here).
#: How long the routing test waits for its connection (a black-holed address costs this once).
ROUTE_TIMEOUT = 1.0


def check_hosting_addr(master: Master, infos: list[tuple[int, str]]) -> None:
    """Raise if no address of ``infos`` (``(family, ip)`` of MASTER_ADDR) is this host or routes here.

    Raises:
        MasterUnreachableError: MASTER_ADDR is not an address of this host (not retried).
    """
    if any(binds(ip) for _, ip in infos):
        return
    if any(_routes_here(family, ip, master.port) for family, ip in infos):
        return
    host = socket.gethostname()
    raise _messages.not_this_host(
        master=master.name, addr=master.addr, resolved=[ip for _, ip in infos], host=host, rank=master.rank
    )


def _routes_here(family: int, ip: str, port: int) -> bool:
    """Whether a connection to ``ip:port`` arrives at a listener of ours on ``port`` (all interfaces)."""
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError:
            return True  # the port is busy (hosting reports it) or cannot be tested: do not guess
        listener.listen(1)
        listener.settimeout(ROUTE_TIMEOUT)
        client = socket.socket(family, socket.SOCK_STREAM)
        client.settimeout(ROUTE_TIMEOUT)
        try:
            client.connect((ip, port))
            conn, _ = listener.accept()  # through a NAT the peer address differs: arriving is what counts
        except OSError:
            return False
        finally:
            client.close()  # the client side closes first: its TIME_WAIT stays off MASTER_PORT
        conn.close()
        return True


# A probe classifies why the master cannot be reached (refused, DNS, no route, black hole, a foreign
# program), and a failure that persists past its grace period (:mod:`distinit.init._policy`) becomes its
# specific error at once instead of the generic timeout at the deadline.
#: One reachability probe's connect bound, and its store-handshake bound.
PROBE_TIMEOUT = 5.0
HANDSHAKE_TIMEOUT = 3.0
#: The probe interval starts fast (a master binding its port right now is the common case at start-up: a
#: refused connect on a LAN costs microseconds), then backs off to one probe per :data:`SLOWEST_PROBE` s.
#: 2 ms: rank 1 usually probes a few milliseconds before rank 0's store listens; at 20 ms that first refusal
#: cost the happy path 20-30 ms at world 2 (issue 27, measured with the phases of a 2-rank setup()).
FIRST_PROBE = 0.002
SLOWEST_PROBE = 2.0


def escalate(grace: Grace, failure: AttemptFailed, *, since: float, master: Master) -> None:
    """Raise the specific error if ``failure``'s kind has now lasted past its grace period."""
    persisted = grace.observe(failure.kind, since, time.monotonic())
    if persisted is not None:
        raise specific_error(failure, persisted.lasted, master)


def host(master: Master, *, end: float) -> TCPStore:
    """Check that MASTER_ADDR is this host, then bind and serve the store (rank 0).

    Raises:
        AttemptFailed: ``dns`` (MASTER_ADDR does not resolve), ``port_busy``, or ``store``.
    """
    try:
        infos = socket.getaddrinfo(master.addr, master.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AttemptFailed("dns", f"MASTER_ADDR={master.addr!r} does not resolve ({exc})") from exc
    check_hosting_addr(master, [(info[0], str(info[4][0])) for info in infos])
    return host_store(master.addr, master.port, timeout=max(end - time.monotonic(), 1.0))


def connect(
    master: Master, *, end: float, grace: Grace, rng: random.Random, stop: threading.Event | None = None
) -> TCPStore:
    """Probe the master until a TCPStore answers, then connect to it (ranks other than 0).

    ``stop``: set when the caller gave up; the pause between probes then ends at once with
    :class:`~distinit.init._thread.Abandoned`.

    Raises:
        AttemptFailed: nothing usable answered before ``end`` (the last probe's kind).
        RendezvousError: a failure outlasted its grace period (the specific error).
    """
    interval = FIRST_PROBE
    last: tuple[FailureKind, str] = ("refused", f"nothing listened on {master.name} within the attempt")
    while (left := end - time.monotonic()) > 0:
        probed_at = time.monotonic()
        seen = probe(master.addr, master.port, min(PROBE_TIMEOUT, left), handshake_timeout=min(HANDSHAKE_TIMEOUT, left))
        logger.debug("rank %d: probe of %s: %s (%s)", master.rank, master.name, seen.kind, seen.detail)
        if seen.kind == "tcpstore":
            grace.clear()
            return connect_store(master.addr, master.port, timeout=max(end - time.monotonic(), 1.0))
        last = ("store" if seen.kind == "error" else seen.kind, f"{master.name}: {seen.detail}")
        persisted = grace.observe(last[0], probed_at, time.monotonic())
        if persisted is not None:
            raise specific_error(AttemptFailed(*last), persisted.lasted, master)
        left = end - time.monotonic()
        if left > 0:
            pause = min(left, interval + rng.uniform(0, interval / 2))
            if stop is None:
                time.sleep(pause)
            elif stop.wait(wait_bound(pause)):
                raise Abandoned
            interval = min(interval * 1.5, SLOWEST_PROBE)
    raise AttemptFailed(*last)
