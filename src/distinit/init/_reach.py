"""Reaching the store: rank 0 binds and serves it; the others probe the master until a TCPStore answers.

A probe classifies why the master cannot be reached (refused, DNS, no route, black hole, a foreign
program), and a failure that persists past its grace period (:mod:`distinit.init._grace`) becomes its
specific error at once instead of the generic timeout at the deadline.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Callable

from torch.distributed import Store, TCPStore

from distinit._net import probe
from distinit.init._attempt import AttemptFailed, FailureKind
from distinit.init._diagnose import Master, specific_error
from distinit.init._grace import Grace
from distinit.init._join import JoinProtocol
from distinit.init._store import connect_store, host_store
from distinit.init._whereami import check_hosting_addr

logger = logging.getLogger("distinit.init")

#: One reachability probe's connect bound, and its store-handshake bound.
PROBE_TIMEOUT = 5.0
HANDSHAKE_TIMEOUT = 3.0
#: The probe interval starts fast (a master binding its port right now is the common case at start-up: a
#: refused connect on a LAN costs microseconds), then backs off to one probe per :data:`SLOWEST_PROBE` s.
FIRST_PROBE = 0.02
SLOWEST_PROBE = 2.0


def escalate(grace: Grace, failure: AttemptFailed, *, since: float, master: Master) -> None:
    """Raise the specific error if ``failure``'s kind has now lasted past its grace period."""
    persisted = grace.observe(failure.kind, since, time.monotonic())
    if persisted is not None:
        raise specific_error(failure, persisted.lasted, master)


def host(master: Master, *, end: float, on_busy: Callable[[float], None]) -> TCPStore:
    """Bind and serve the store (rank 0); ``on_busy(end)`` runs when the port is taken, before the failure.

    Raises:
        AttemptFailed: ``dns`` (MASTER_ADDR does not resolve), ``port_busy``, or ``store``.
    """
    try:
        infos = socket.getaddrinfo(master.addr, master.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AttemptFailed("dns", f"MASTER_ADDR={master.addr!r} does not resolve ({exc})") from exc
    check_hosting_addr(master, [(info[0], str(info[4][0])) for info in infos])
    try:
        return host_store(master.addr, master.port, timeout=max(end - time.monotonic(), 1.0))
    except AttemptFailed as busy:
        if busy.kind == "port_busy":
            on_busy(end)
        raise


def publish_duplicate_master(port: int, *, end: float, protocol: Callable[[Store], JoinProtocol]) -> None:
    """The port is taken: if its holder is a TCPStore where rank 0 is claimed, we are a duplicate rank 0.

    Then joining as a client publishes (and raises) ``DuplicateRankError`` naming both rank-0 processes.
    """
    seen = probe("127.0.0.1", port, min(2.0, max(end - time.monotonic(), 0.1)), handshake_timeout=1.0)
    if seen.kind != "tcpstore":
        return
    try:
        store = connect_store("127.0.0.1", port, timeout=min(5.0, max(end - time.monotonic(), 0.5)))
    except AttemptFailed:
        return
    join = protocol(store)
    generation = join.generation()
    if store.check([f"{join.namespace}g{generation}/claim/0"]):
        join.enter(generation)


def connect(
    master: Master, *, end: float, grace: Grace, rng: random.Random, sleep: Callable[[float], None]
) -> TCPStore:
    """Probe the master until a TCPStore answers, then connect to it (ranks other than 0).

    Raises:
        AttemptFailed: nothing usable answered before ``end`` (the last probe's kind).
        RendezvousError: a failure outlasted its grace period (the specific error).
    """
    interval = FIRST_PROBE
    failure: AttemptFailed | None = None
    while (left := end - time.monotonic()) > 0:
        probed_at = time.monotonic()
        seen = probe(master.addr, master.port, min(PROBE_TIMEOUT, left), handshake_timeout=min(HANDSHAKE_TIMEOUT, left))
        logger.debug("rank %d: probe of %s: %s (%s)", master.rank, master.name, seen.kind, seen.detail)
        if seen.kind == "tcpstore":
            grace.clear()
            return connect_store(master.addr, master.port, timeout=max(end - time.monotonic(), 1.0))
        kind: FailureKind = "store" if seen.kind == "error" else seen.kind
        failure = AttemptFailed(kind, f"{master.name}: {seen.detail}")
        escalate(grace, failure, since=probed_at, master=master)
        left = end - time.monotonic()
        if left > 0:
            sleep(min(left, interval + rng.uniform(0, interval / 2)))
            interval = min(interval * 1.5, SLOWEST_PROBE)
    raise failure or AttemptFailed("refused", f"nothing listened on {master.name} within the attempt")
