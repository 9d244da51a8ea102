"""The rendezvous store: rank 0 hosts one TCPStore for the whole deadline; the others connect with bounds.

torch's TCPStore client retries connect+validate around a socket connect that itself retries, so one
client constructor can take 1.8-2.7x its timeout, and a foreign listener that accepts and holds blocks it
without bound (measured on torch 2.13). Clients therefore only construct a TCPStore after
:func:`distinit.init._probe.probe` saw a TCPStore answer, and the constructor runs in a helper thread
joined with a bound.
"""

from __future__ import annotations

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
    try:
        # multi_tenant: if this process still serves the port (a store that outlived teardown), reuse it.
        return TCPStore(
            host,
            port,
            is_master=True,
            wait_for_workers=False,
            multi_tenant=True,
            timeout=to_timedelta(max(timeout, 0.1)),
        )
    except (dist.DistError, RuntimeError) as exc:
        if is_port_busy(exc):
            raise AttemptFailed("port_busy", f"cannot bind MASTER_PORT={port}: address already in use") from exc
        raise AttemptFailed("store", f"cannot host the store on port {port}: {quote(exc)}") from exc


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
