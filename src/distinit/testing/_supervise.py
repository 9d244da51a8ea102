"""Rank processes from the parent's side: start them from the fork server, signal them, stop their trees.

A rank is held through a pidfd opened right after it started (it is then blocked waiting for its
first task, so the pid is certainly its own). Every signal goes through that handle, never through
the bare pid or its process group: the fork server, not this process, reaps a rank, so its pid may
belong to an unrelated process as soon as the rank has exited (see ``_tree``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess

from distinit.testing._child import worker_main
from distinit.testing._tree import Held, kill_tree

__all__ = ["REAP_WAIT", "RankProcess", "start_ranks", "stop_all", "warm_up"]

#: How long to wait for a killed rank to be reaped.
REAP_WAIT = 2.0

_PRELOAD = ["torch", "torch.distributed", "distinit.testing._child"]
_lock = threading.Lock()


def _context() -> ForkServerContext:
    return multiprocessing.get_context("forkserver")


def _preload() -> list[str]:
    names = list(_PRELOAD)
    if "pytest" in sys.modules:
        names.append("_pytest.assertion.rewrite")
    return names


def warm_up() -> None:
    """Start the fork server (it imports torch in the background) so the first test does not wait as long.

    Idempotent and cheap to call; does nothing if the fork server already runs.
    """
    with _lock:
        _context().set_forkserver_preload(_preload())
        from multiprocessing import forkserver

        forkserver.ensure_running()


@dataclass
class RankProcess:
    """One rank process, its pipe, and the handle every signal to it goes through."""

    process: BaseProcess
    conn: multiprocessing.connection.Connection
    held: Held | None
    dead: bool = False

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the rank if it has not exited; False otherwise."""
        return self.held is not None and self.held.signal(signum)

    def kill(self) -> None:
        """SIGKILL the rank and every descendant it still holds; nothing once it has exited."""
        if self.held is not None:
            kill_tree(self.held)
        self.dead = True

    def reap(self, timeout: float) -> None:
        """Wait (bounded) for the fork server's report of its exit; release the pipe and the handle."""
        self.process.join(timeout)
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.held is not None:
            self.held.close()


def _start_one(ctx: ForkServerContext, rank: int, *, reuse: bool) -> RankProcess:
    parent_end, child_end = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=worker_main, args=(child_end, os.getpid(), reuse), name=f"distinit-rank{rank}", daemon=False
    )
    process.start()  # blocks until the fork server has imported torch (first time only)
    child_end.close()
    assert process.pid is not None
    # Held while it waits for its first task: the pid cannot have been recycled yet.
    held = Held.open(process.pid)
    return RankProcess(process, parent_end, held, dead=held is None)


def start_ranks(world_size: int, *, reuse: bool) -> list[RankProcess]:
    """Start ``world_size`` rank processes; on any interruption, leave none behind."""
    ctx = _context()
    with _lock:
        ctx.set_forkserver_preload(_preload())
    ranks: list[RankProcess] = []
    try:
        for rank in range(world_size):
            ranks.append(_start_one(ctx, rank, reuse=reuse))
    except BaseException:
        stop_all(ranks)  # interrupted (pytest-timeout, ^C): leave nothing behind
        raise
    return ranks


def stop_all(ranks: list[RankProcess]) -> None:
    """Kill every rank's tree, then reap them all."""
    for rank in ranks:
        rank.kill()
    for rank in ranks:
        rank.reap(REAP_WAIT)
