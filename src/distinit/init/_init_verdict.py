"""A verdict reached during ``init_process_group`` (gloo's loopback trap), the same on every rank, at once.

The join's ``state`` key already says ``ok`` when init runs, so a verdict found in init has a key of its
own, ``<namespace>g<generation>/init_verdict`` (first writer wins). The rank that recognises its own gloo
failure as the loopback trap publishes it; a rank whose init failed otherwise reads it before giving up on
the generation, so no rank starts a new generation for it (the ranks would drift apart, each waiting for
the others in another generation until the deadline). A rank still blocked in init (gloo's listener side
waits about five times its timeout for a peer that can never connect) learns it from :class:`InitWatch`, a
thread with its own store connection, and its caller raises it at once. The store host stays up until the
others have read it, at most :data:`distinit._board.LINGER` s (the key is a :class:`distinit._board.Board`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed import TCPStore

from distinit._board import Board
from distinit._net import interfaces
from distinit.env import DistEnv
from distinit.errors import RendezvousError
from distinit.init import _loopback, _messages
from distinit.init._diagnose import Master

if TYPE_CHECKING:
    from distinit.init._join import JoinProtocol

logger = logging.getLogger("distinit.init")

#: How often a blocked rank's watch looks for the verdict, and its store connection's bound.
WATCH_EVERY = 0.25
WATCH_TIMEOUT = 5.0

_Failure = (dist.DistError, RuntimeError, OSError, ValueError)


def verdict_key(namespace: str, generation: int) -> str:
    """The store key of ``generation``'s init verdict."""
    return f"{namespace}g{generation}/init_verdict"


def classify_init_failure(
    exc: BaseException, *, join: JoinProtocol, generation: int, env: DistEnv, hosting: bool
) -> RendezvousError | None:
    """The verdict for this rank's failed init: its own loopback failure (published), a peer's, or None.

    None means an ordinary failure: the caller abandons the generation and retries.
    """
    board = Board(join.store, verdict_key(join.namespace, generation), rank=env.rank, world_size=env.world_size)
    own = _own_verdict(exc, env=env, master=join.master, generation=generation)
    try:
        found = board.publish(_messages.verdict_to_json(own)) if own is not None else board.read()
    except _Failure as failure:  # the store went away: our own finding still stands
        logger.debug("rank %d: init verdict key unreachable: %s", env.rank, failure)
        return own
    if found is None:
        return None
    _acknowledge(board, hosting=hosting)
    return _messages.verdict_from_json(found, rank=env.rank)


def _own_verdict(exc: BaseException, *, env: DistEnv, master: str, generation: int) -> RendezvousError | None:
    """This rank's gloo error as the loopback trap, if it names a loopback peer in a world that spans hosts."""
    remote = _loopback.loopback_remote(str(exc))
    if remote is None:
        return None
    evidence = _loopback.world_spans_hosts(env)
    if evidence is None:  # one host: a loopback peer that refused is a peer that died
        return None
    host = socket.gethostname()
    return _messages.loopback_mesh(
        rank=env.rank,
        host=host,
        remote=remote,
        evidence=evidence,
        fix=_messages.loopback_fix(
            host=host,
            route=_loopback.route_interface(env.master_addr, env.master_port),
            interfaces=interfaces(),
        ),
        master=master,
        generation=generation,
    )


def _acknowledge(board: Board, *, hosting: bool) -> None:
    """This rank read the verdict; the store host then waits for the others to read it too."""
    with contextlib.suppress(*_Failure):  # the verdict is known; a store gone meanwhile only ends the wait
        board.acknowledge()
        if hosting:
            board.linger()


class InitWatch:
    """While init runs, look for a peer's init verdict from a thread (see the module docstring).

    Enabled only where it can matter: gloo, this host advertising a loopback address, and a world that
    spans hosts; elsewhere :meth:`during` does nothing and no connection is opened.
    """

    def __init__(
        self, master: Master, *, env: DistEnv, backend: str, environ: Mapping[str, str], hosting: bool
    ) -> None:
        self.master, self.env, self.hosting = master, env, hosting
        advertised = _loopback.advertised(environ) if backend == "gloo" and env.world_size > 1 else None
        self.enabled = bool(advertised and advertised.loopback and _loopback.world_spans_hosts(env))
        self._verdict: RendezvousError | None = None

    def verdict(self) -> RendezvousError | None:
        """The verdict a peer published while this rank was in init, or None (read by the caller's thread)."""
        return self._verdict

    @contextlib.contextmanager
    def during(self, namespace: str, generation: int) -> Iterator[None]:
        """Watch ``generation``'s verdict key for the duration of the block."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()
        key = verdict_key(namespace, generation)
        thread = threading.Thread(
            target=self._run, args=(key, stop), name=f"distinit-init-watch-rank{self.env.rank}", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()

    def _run(self, key: str, stop: threading.Event) -> None:
        try:
            store = TCPStore(
                self.master.addr,
                self.master.port,
                is_master=False,
                wait_for_workers=False,
                timeout=timedelta(seconds=WATCH_TIMEOUT),
            )
            board = Board(store, key, rank=self.env.rank, world_size=self.env.world_size)
            while not stop.wait(WATCH_EVERY):
                found = board.read()
                if found is not None:
                    _acknowledge(board, hosting=self.hosting)
                    self._verdict = _messages.verdict_from_json(found, rank=self.env.rank)
                    return
        except _Failure as exc:  # the store went away: the attempt itself sees that too
            logger.debug("rank %d: init watch stopped: %s", self.env.rank, exc)
