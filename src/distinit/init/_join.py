"""The join protocol on the store: world-size agreement, rank claims, a joined counter and one verdict key.

Keys live under ``<namespace>g<generation>/`` so that a retry after a failed ``init_process_group`` starts
from clean keys (the generation is bumped through the store, first writer wins):

* ``world_size`` -- first writer wins (``compare_set``); a rank reading another value publishes a
  :class:`~distinit.errors.WorldSizeMismatchError` verdict.
* ``claim/<rank>`` -- ``host|pid|nonce`` of the claimant; a rank finding a live foreign claim publishes a
  :class:`~distinit.errors.DuplicateRankError` naming both claimants. A claim by a dead pid on the same
  host (a crashed, restarted rank) is taken over.
* ``joined`` -- counter; the rank that brings it to ``world_size`` sets ``state`` to ``ok``.
* ``state`` -- ``ok`` or a verdict (JSON), first writer wins, so every rank raises the SAME verdict.
* ``seen`` -- counter of ranks that read a verdict, so the store host can linger just long enough.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from datetime import timedelta

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from distinit.errors import RendezvousError
from distinit.init import _messages
from distinit.init._attempt import AttemptFailed

logger = logging.getLogger("distinit.init")

#: Seconds before the first "waiting for ranks" progress record, and between later ones.
PROGRESS_FIRST = 10.0
PROGRESS_EVERY = 30.0
#: Longest time the store host stays up after a verdict so that peers can read it.
LINGER = 3.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_PROCESS_NONCE = uuid.uuid4().hex[:12]


class Claimant:
    """Who this process is on the store: host, pid and a nonce (pids repeat across hosts and containers).

    The nonce is fixed per process, so a later call in the same process recognises its own earlier claim;
    a forked child differs by pid.
    """

    def __init__(self, host: str | None = None, pid: int | None = None, nonce: str | None = None) -> None:
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.nonce = nonce or _PROCESS_NONCE

    def encode(self) -> str:
        """The store value: ``host|pid|nonce``."""
        return f"{self.host}|{self.pid}|{self.nonce}"

    @staticmethod
    def describe(value: str) -> str:
        """``host|pid|nonce`` as words: ``host pid N``."""
        host, _, rest = value.partition("|")
        pid = rest.partition("|")[0]
        return f"{host} pid {pid}"


class JoinProtocol:
    """Run the join protocol for one rank against one store (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        namespace: str,
        rank: int,
        world_size: int,
        master: str,
        hosting: bool,
        claimant: Claimant | None = None,
        deadline: float = 0.0,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.rank = rank
        self.world_size = world_size
        self.master = master
        self.hosting = hosting
        self.me = claimant or Claimant()
        self.deadline = deadline
        self._entered: set[int] = set()
        self._waiting_since: float | None = None
        self._next_progress: float | None = None

    # keys -----------------------------------------------------------------------------------------
    def _key(self, generation: int, name: str) -> str:
        return f"{self.namespace}g{generation}/{name}"

    def prefix(self, generation: int) -> str:
        """Prefix for the process group's own keys in ``generation``."""
        return self._key(generation, "pg")

    def generation(self) -> int:
        """The current generation (created as 0 by the first rank to ask)."""
        return int(_text(self.store.compare_set(f"{self.namespace}generation", "", "0")))

    def abandon(self, generation: int) -> None:
        """Move every rank on to ``generation + 1`` (no-op if someone already did)."""
        key = f"{self.namespace}generation"
        self.store.compare_set(key, str(generation), str(generation + 1))

    def _get_now(self, key: str) -> str | None:
        if not self.store.check([key]):
            return None
        return _text(self.store.get(key))

    # protocol -------------------------------------------------------------------------------------
    def enter(self, generation: int) -> None:
        """Agree on the world size, claim this rank and count it (once per generation).

        Raises:
            WorldSizeMismatchError: another rank recorded another world size (published as the verdict).
            DuplicateRankError: a live process already claimed this rank (published as the verdict).
            RendezvousError: a verdict was already published in this generation.
        """
        if generation in self._entered:
            return
        state = self._get_now(self._key(generation, "state"))
        if state is not None and state != "ok":
            raise self._read_verdict(generation, state)
        mine = f"{self.world_size}|{self.rank}|{self.me.encode()}"
        recorded = _text(self.store.compare_set(self._key(generation, "world_size"), "", mine))
        if recorded != mine:
            size, first_rank, who = recorded.split("|", 2)
            if int(size) != self.world_size:
                self._publish(
                    generation,
                    _messages.world_size_mismatch(
                        master=self.master,
                        generation=generation,
                        first=(int(first_rank), int(size), Claimant.describe(who)),
                        second=(self.rank, self.world_size, Claimant.describe(self.me.encode())),
                        local_rank=self.rank,
                    ),
                )
        claim_key = self._key(generation, f"claim/{self.rank}")
        me = self.me.encode()
        holder = _text(self.store.compare_set(claim_key, "", me))
        takeover = False
        if holder != me:
            host, pid = holder.split("|")[:2]
            if host == self.me.host and pid.isdigit() and int(pid) != self.me.pid and not _pid_alive(int(pid)):
                # A crashed process of this rank on this host: take its claim over; it was already counted.
                takeover = _text(self.store.compare_set(claim_key, holder, me)) == me
            if not takeover:
                self._publish(
                    generation,
                    _messages.duplicate_rank(
                        rank=self.rank,
                        master=self.master,
                        generation=generation,
                        first=Claimant.describe(holder),
                        second=Claimant.describe(me),
                        local_rank=self.rank,
                    ),
                )
        self._entered.add(generation)
        if not takeover and self.store.add(self._key(generation, "joined"), 1) >= self.world_size:
            self.store.compare_set(self._key(generation, "state"), "", "ok")

    def wait(self, generation: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until every rank joined ``generation``.

        Raises:
            AttemptFailed: (kind ``join``) not all ranks joined in time; names the missing ranks.
            RendezvousError: a verdict was published (the same on every rank).
        """
        key = self._key(generation, "state")
        now = time.monotonic()
        end = now + max(timeout, 0.0)
        if self._waiting_since is None:
            self._waiting_since = now
            self._next_progress = now + PROGRESS_FIRST
        while True:
            now = time.monotonic()
            left = end - now
            if left <= 0:
                state = self._get_now(key)  # a last look: the last "ok" may have arrived as the wait ended
                if state == "ok":
                    return
                if state is not None:
                    raise self._read_verdict(generation, state)
                missing = tuple(self.missing(generation))
                joined = self.world_size - len(missing)
                raise AttemptFailed(
                    "join",
                    f"{joined}/{self.world_size} ranks joined generation {generation}, missing ranks "
                    f"{_messages._ranks(missing)}",
                    missing_ranks=missing,
                )
            self._progress(generation)
            next_progress = self._next_progress if self._next_progress is not None else end
            step = max(0.01, min(left, next_progress - now))
            try:
                self.store.wait([key], timedelta(seconds=step))
            except dist.DistStoreError:
                continue  # a wait slice ended: log progress if due, then wait on
            state = _text(self.store.get(key))
            if state == "ok":
                return
            raise self._read_verdict(generation, state)

    def missing(self, generation: int) -> list[int]:
        """Ranks with no live claim in ``generation``.

        A claim by a dead pid on this host (a rank that crashed after claiming) counts as missing; a dead
        claimant on another host cannot be seen from here. Two store round trips per rank at most.
        """
        out = []
        for r in range(self.world_size):
            key = self._key(generation, f"claim/{r}")
            if not self.store.check([key]):
                out.append(r)
                continue
            host, _, rest = _text(self.store.get(key)).partition("|")
            pid = rest.partition("|")[0]
            if host == self.me.host and pid.isdigit() and not _pid_alive(int(pid)):
                out.append(r)
        return out

    # internals ------------------------------------------------------------------------------------
    def _progress(self, generation: int) -> None:
        now = time.monotonic()
        if self._next_progress is None or now < self._next_progress or self._waiting_since is None:
            return
        self._next_progress = now + PROGRESS_EVERY
        missing = self.missing(generation)
        waited = now - self._waiting_since
        logger.info(
            "rank %d: waiting for ranks %s to join rendezvous %s (generation %d): %d/%d joined, %.0f s of %.0f s",
            self.rank,
            _messages._ranks(missing),
            self.master,
            generation,
            self.world_size - len(missing),
            self.world_size,
            waited,
            self.deadline,
            extra={
                "distinit": {
                    "event": "init.waiting",
                    "rank": self.rank,
                    "generation": generation,
                    "missing_ranks": missing[:64],
                    "joined": self.world_size - len(missing),
                    "world_size": self.world_size,
                    "waited_s": round(waited, 1),
                }
            },
        )

    def _publish(self, generation: int, verdict: RendezvousError) -> None:
        text = _messages.verdict_to_json(verdict)
        state = _text(self.store.compare_set(self._key(generation, "state"), "", text))
        if state in (text, "ok"):
            # Ours is the verdict (or the world formed without this process): raise it here.
            self._linger(generation)
            raise verdict
        raise self._read_verdict(generation, state)

    def _read_verdict(self, generation: int, state: str) -> RendezvousError:
        # If the host is gone already, the verdict text is what matters.
        with contextlib.suppress(dist.DistError):
            self.store.add(self._key(generation, "seen"), 1)
        self._linger(generation)
        return _messages.verdict_from_json(state, rank=self.rank)

    def _linger(self, generation: int) -> None:
        """On the store host: stay up until every joined rank read the verdict, at most :data:`LINGER` s."""
        if not self.hosting:
            return
        end = time.monotonic() + LINGER
        while time.monotonic() < end:
            try:
                seen = self.store.add(self._key(generation, "seen"), 0)
                joined = self.store.add(self._key(generation, "joined"), 0)
            except dist.DistError:
                return
            if seen >= joined:
                return
            time.sleep(0.05)
