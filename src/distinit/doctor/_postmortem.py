"""When the world does not form: every rank's local checks to rank 0 through a store of its own, bounded.

A world that does not form still has ranks that know what is wrong with their host. Rank 0 hosts a TCPStore
on ``MASTER_ADDR:MASTER_PORT`` (the rendezvous gave it up) for at most :data:`SHARE_S` seconds; every other
rank connects (bounded, through init's own helpers), leaves its local checks under its key and waits for
rank 0's ``merged`` key, so that a launcher that stops every task at the first failure (torchrun) does not
stop rank 0 before it printed. Rank 0 validates what each rank sent (:mod:`distinit.doctor._peer`) and
prints them merged. Best effort: a rank that cannot reach rank 0 (which may be the very fault) gives up
after the bound and prints its own line, as before.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING

from distinit.doctor._model import Check
from distinit.doctor._peer import NAME_CHARS, PeerLocal, parse_local
from distinit.env import DistEnv

if TYPE_CHECKING:
    from torch.distributed import Store

logger = logging.getLogger("distinit.doctor")

#: The longest the exchange may take, on any rank.
SHARE_S = 3.0
_KEY = "distinit-doctor/local/{rank}"
_MERGED = "distinit-doctor/merged"
_ACK = "distinit-doctor/read/{rank}"
#: The longest rank 0 keeps its store up for the others to read ``merged`` (within the exchange's bound).
ACK_S = 1.0
#: Share of the bound rank 0 waits for the others' checks before it answers.
COLLECT_SHARE = 0.6
#: How often a waiting rank looks for the keys it waits for.
POLL_S = 0.05


def share_local(env: DistEnv, local: list[Check], *, host: str, timeout: float) -> dict[int, PeerLocal | str] | None:
    """Send this rank's ``local`` checks to rank 0; on rank 0, return every rank's (or why it is unusable).

    Returns None on every rank but 0, and on rank 0 when there is nothing to merge (a world of one, no
    rendezvous endpoint, no time left, or the store could not be hosted). Ranks that never answered within
    ``timeout`` are absent from the result. Never raises.
    """
    if env.world_size == 1 or env.master_addr is None or env.master_port is None or timeout < 0.5:
        return None

    from distinit.init import AttemptFailed, Unsupported, connect_store, host_store

    started = time.monotonic()
    mine = PeerLocal(rank=env.rank, host=host[:NAME_CHARS], local=tuple(local))
    try:
        if env.rank != 0:
            if not _listening(env.master_addr, env.master_port, timeout):
                return None  # no answer at all: torch's client would only print its native connect trace
            store = connect_store(env.master_addr, env.master_port, timeout=timeout)
            store.set(_KEY.format(rank=env.rank), mine.model_dump_json())
            if not _await(store, [_MERGED], timeout):
                return None
            store.set(_ACK.format(rank=env.rank), "1")  # rank 0 keeps its store until this is read
            return None
        store = host_store(env.master_addr, env.master_port, timeout=timeout)
    except (AttemptFailed, Unsupported, RuntimeError, OSError) as exc:  # DistStoreError is a RuntimeError
        logger.debug("rank %d: local checks not shared after the world failed: %s", env.rank, exc)
        return None
    keys = [_KEY.format(rank=r) for r in range(1, env.world_size)]
    # Collect for part of the bound only: the ranks that answered wait for ``merged`` for all of it, and
    # one that arrived a little before rank 0 must still hear it (a rank that never came costs the rest).
    with contextlib.suppress(RuntimeError):  # some never answered: merge those that did
        _await(store, keys, COLLECT_SHARE * timeout)
    found: dict[int, PeerLocal | str] = {0: mine}
    for rank, key in enumerate(keys, start=1):
        if store.check([key]):
            found[rank] = parse_local(store.get(key), rank=rank)
    store.set(_MERGED, "1")
    # Closing the store while a rank still waits for ``merged`` fails that wait with torch's native trace on
    # the rank's stderr: hold it until every rank that answered has read it (bounded by what is left).
    acks = [_ACK.format(rank=r) for r in found if r != 0]
    left = max(0.1, min(ACK_S, timeout - (time.monotonic() - started)))
    with contextlib.suppress(RuntimeError):
        _await(store, acks, left)
    return found


def _await(store: Store, keys: list[str], seconds: float) -> bool:
    """Whether all ``keys`` are set within ``seconds``, polled: a timed-out ``store.wait`` logs torch's native trace."""
    end = time.monotonic() + seconds
    while not store.check(keys):
        if time.monotonic() >= end:
            return False
        time.sleep(POLL_S)
    return True


def _listening(host: str, port: int, seconds: float) -> bool:
    """Whether a plain TCP connect to ``host:port`` succeeds within ``seconds`` (retried while refused)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            with socket.create_connection((host, port), timeout=min(left, 1.0)):
                return True
        except OSError:
            time.sleep(min(POLL_S * 2, max(0.0, end - time.monotonic())))
    return False
