"""Rank processes kept alive between calls (``reuse=True``), one pool per world size and backend.

A pool is discarded after any failure, so a failure never leaks into the next call. Pools are
stopped at the end of a pytest session (the plugin's ``pytest_sessionfinish``) and, outside
pytest, at interpreter exit: that ``atexit`` hook is registered when the first pool is created,
never merely because the plugin was imported.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from dataclasses import dataclass, field

from distinit.testing._supervise import REAP_WAIT, RankProcess, start_ranks, stop_all

__all__ = ["Pool", "acquire", "close_pools", "release"]

_lock = threading.Lock()
_pools: dict[tuple[int, str], Pool] = {}
_exit_hook_registered = False


@dataclass
class Pool:
    """Ranks kept alive between calls (``reuse=True``). Replaced after any failure."""

    world_size: int
    ranks: list[RankProcess] = field(default_factory=list)

    def alive(self) -> bool:
        """Every rank still runs and none was killed."""
        return bool(self.ranks) and all(r.process.is_alive() and not r.dead for r in self.ranks)

    def close(self) -> None:
        """Ask every rank to exit (they reap what they spawned), then kill any that did not."""
        for rank in self.ranks:
            with contextlib.suppress(OSError, ValueError):
                rank.conn.send(None)
        for rank in self.ranks:
            rank.process.join(REAP_WAIT)
            if rank.process.is_alive():
                rank.kill()
            rank.reap(REAP_WAIT)
        self.ranks = []


def close_pools() -> None:
    """Stop every pooled rank process (``reuse=True``). Called at exit and at the end of a pytest session."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


def _register_exit_hook() -> None:
    global _exit_hook_registered
    with _lock:
        if not _exit_hook_registered:
            atexit.register(close_pools)
            _exit_hook_registered = True


def acquire(world_size: int, backend: str) -> Pool:
    """A live pool for this world size and backend (started now when there is none)."""
    with _lock:
        pool = _pools.pop((world_size, backend), None)
    if pool is not None and pool.alive():
        return pool
    if pool is not None:
        pool.close()
    _register_exit_hook()
    return Pool(world_size, start_ranks(world_size, reuse=True))


def release(pool: Pool, backend: str, *, poisoned: bool) -> None:
    """Put ``pool`` back for the next call, or discard it (``poisoned``: a call on it failed)."""
    if poisoned:
        stop_all(pool.ranks)
        pool.ranks = []
        return
    with _lock:
        previous = _pools.pop((pool.world_size, backend), None)
        _pools[(pool.world_size, backend)] = pool
    if previous is not None and previous is not pool:
        previous.close()
