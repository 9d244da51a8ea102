"""The join protocol on the store: world-size agreement, rank claims, a joined counter and one verdict key.

Keys live under ``<namespace>g<generation>/`` so that a retry after a failed ``init_process_group`` starts
from clean keys (the generation is bumped through the store, first writer wins):

* ``world_size`` -- first writer wins (``compare_set``); a rank reading another value publishes a
  :class:`~distinit.errors.WorldSizeMismatchError` verdict.
* ``claim/<rank>`` -- ``host|pid|nonce`` of the claimant; a rank finding a live foreign claim publishes a
  :class:`~distinit.errors.DuplicateRankError` naming both claimants. A claim by a dead pid on the same
  host (a crashed, restarted rank) is taken over.
* ``joined`` -- counter; the rank that brings it to ``world_size`` sets ``state`` to ``ok``.
* ``order/<n>`` -- the rank that was the n-th to join; ``beat/<rank>`` -- its liveness while it waits
  (:mod:`distinit.init._heartbeat`): a joined rank that stops beating ends the rendezvous in seconds.
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
from collections.abc import Callable
from typing import NoReturn

import torch.distributed as dist
from torch.distributed import Store

from distinit._duration import to_timedelta
from distinit.errors import RankLostError, RendezvousError
from distinit.init import _messages
from distinit.init._attempt import AttemptFailed
from distinit.init._heartbeat import Heartbeat, Silent

logger = logging.getLogger("distinit.init")

#: Seconds before the first "waiting for ranks" progress record, and between later ones.
PROGRESS_FIRST = 10.0
PROGRESS_EVERY = 30.0
#: Longest time the store host stays up after a verdict so that peers can read it.
LINGER = 3.0
#: Waiting for a key: first one blocking store wait of at most FAST_WAIT s (it wakes the moment the key is
#: set: the common case at start-up, when ranks arrive within milliseconds), then a poll every POLL s. A
#: store wait cannot be called off and logs a c10d warning each time it times out, while a poll is one
#: round trip between sleeps that the caller can cut short.
FAST_WAIT = 1.0
POLL = 0.25


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
        resumed: bool = False,
        launched: tuple[int, str] | None = None,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.rank = rank
        self.world_size = world_size
        self.master = master
        self.hosting = hosting
        self.me = claimant or Claimant()
        self.deadline = deadline
        # True when this call reuses the namespace of an interrupted call of this process (see enter()).
        self.resumed = resumed
        self._entered: set[int] = set()
        self._waiting_since: float | None = None
        self._next_progress: float | None = None
        self._heartbeat: Heartbeat | None = None
        # The launcher's own process count (see _launched), and (missing count, since when) for the hint.
        self.launched = launched
        self._arrivals: tuple[int, float] | None = None

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
        formed = state == "ok"  # a world that formed before this process came: a conflict is another job's
        self._agree(generation, formed=formed)
        claim_key = self._key(generation, f"claim/{self.rank}")
        me = self.me.encode()
        # A resumed namespace may hold our own claim from the interrupted call before: counted then already.
        claimed_before = self.resumed and self.store.check([claim_key])
        holder = _text(self.store.compare_set(claim_key, "", me))
        counted = claimed_before and holder == me
        takeover = False
        if holder != me:
            host, pid = holder.split("|")[:2]
            if host == self.me.host and pid.isdigit() and int(pid) != self.me.pid and not _pid_alive(int(pid)):
                # A crashed process of this rank on this host: take its claim over; it was already counted.
                takeover = _text(self.store.compare_set(claim_key, holder, me)) == me
            if not takeover:
                self._refuse(
                    generation,
                    formed=formed,
                    holder=(self.rank, self.world_size, holder),
                    verdict=_messages.duplicate_rank(
                        rank=self.rank,
                        master=self.master,
                        generation=generation,
                        first=Claimant.describe(holder),
                        second=Claimant.describe(me),
                        local_rank=self.rank,
                    ),
                )
        self._entered.add(generation)
        self._count(generation, counted=takeover or counted)

    def _agree(self, generation: int, *, formed: bool) -> None:
        """Record this world size, or refuse another one recorded first."""
        mine = f"{self.world_size}|{self.rank}|{self.me.encode()}"
        recorded = _text(self.store.compare_set(self._key(generation, "world_size"), "", mine))
        if recorded == mine:
            return
        size, first_rank, who = recorded.split("|", 2)
        if int(size) != self.world_size:
            self._refuse(
                generation,
                formed=formed,
                holder=(int(first_rank), int(size), who),
                verdict=_messages.world_size_mismatch(
                    master=self.master,
                    generation=generation,
                    first=(int(first_rank), int(size), Claimant.describe(who)),
                    second=(self.rank, self.world_size, Claimant.describe(self.me.encode())),
                    local_rank=self.rank,
                ),
            )

    def _count(self, generation: int, *, counted: bool) -> None:
        """Beat, count this rank (unless ``counted`` already) and keep beating until the world is complete."""
        self.stop_beating()  # a beat of an earlier generation
        heartbeat = Heartbeat(
            self.store,
            prefix=self._key(generation, ""),
            rank=self.rank,
            lost=lambda silent: self._publish_lost(generation, silent),
        )
        heartbeat.beat()  # before counting: whoever learns of this rank finds its beat
        if not counted:
            position = self.store.add(self._key(generation, "joined"), 1)
            self.store.set(self._key(generation, f"order/{position}"), str(self.rank))
            if position >= self.world_size:
                self.store.compare_set(self._key(generation, "state"), "", "ok")
                return  # the last rank to join has nobody left to wait for
        self._heartbeat = heartbeat
        heartbeat.start()

    @property
    def host_claimant(self) -> str | None:
        """``host pid N`` of rank 0 once this rank's heartbeat watches it (names it if the store host dies)."""
        claim = self._heartbeat.host_claim if self._heartbeat is not None else None
        return Claimant.describe(claim) if claim else None

    @property
    def beating(self) -> bool:
        """Whether this rank joined a generation that is not complete yet (and still counts on it)."""
        return self._heartbeat is not None

    def stop_beating(self) -> None:
        """Stop this rank's heartbeat (the join completed, ended in a verdict, or was given up)."""
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()

    def wait(self, generation: int, timeout: float, *, sleep: Callable[[float], None] = time.sleep) -> None:
        """Wait up to ``timeout`` seconds until every rank joined ``generation`` (see :func:`wait_for_key`).

        ``sleep`` pauses between polls; it may raise to call the wait off (the caller gave up).

        Raises:
            AttemptFailed: (kind ``join``) not all ranks joined in time; names the missing ranks.
            RendezvousError: a verdict was published (the same on every rank).
        """
        key = self._key(generation, "state")
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
            self._next_progress = now + PROGRESS_FIRST
        if not wait_for_key(
            self.store, key, now + max(timeout, 0.0), sleep=sleep, tick=lambda: self._progress(generation)
        ):
            state = self._get_now(key)  # a last look: the last "ok" may have arrived as the wait ended
            if state is None:
                missing = tuple(self.missing(generation))
                raise AttemptFailed(
                    "join",
                    f"{self.world_size - len(missing)}/{self.world_size} ranks joined generation {generation}, "
                    f"missing ranks {_messages._ranks(missing)}",
                    missing_ranks=missing,
                )
        else:
            state = _text(self.store.get(key))
        self.stop_beating()
        if state != "ok":
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
        if self._arrivals is None or self._arrivals[0] != len(out):
            self._arrivals = (len(out), time.monotonic())
        return out

    def hint(self, missing: tuple[int, ...] | list[int]) -> str | None:
        """Why ``missing`` may never come: an oversized WORLD_SIZE (see :func:`_messages.oversized`)."""
        quiet = time.monotonic() - self._arrivals[1] if self._arrivals is not None else 0.0
        return _messages.oversized(world_size=self.world_size, missing=missing, launched=self.launched, quiet_for=quiet)

    # internals ------------------------------------------------------------------------------------
    def _progress(self, generation: int) -> None:
        now = time.monotonic()
        if self._next_progress is None or now < self._next_progress or self._waiting_since is None:
            return
        self._next_progress = now + PROGRESS_EVERY
        _log_waiting(self, generation, missing=self.missing(generation), waited=now - self._waiting_since)

    def _refuse(
        self, generation: int, *, formed: bool, holder: tuple[int, int, str], verdict: RendezvousError
    ) -> NoReturn:
        """Refuse a conflicting claim ``holder`` (rank, world size, claim).

        Another job's if its world had formed before this process came (raised here only: that job is
        healthy); else ``verdict``, published for every rank.
        """
        if formed:
            rank, size, claim = holder
            raise _messages.another_job(
                master=self.master, holder=Claimant.describe(claim), holder_rank=rank, world_size=size, rank=self.rank
            )
        self._publish(generation, verdict)

    def _publish(self, generation: int, verdict: RendezvousError) -> NoReturn:
        text = _messages.verdict_to_json(verdict)
        state = _text(self.store.compare_set(self._key(generation, "state"), "", text))
        if state in (text, "ok"):
            # Ours is the verdict (or the world formed without this process): raise it here.
            self._linger(generation)
            raise verdict
        raise self._read_verdict(generation, state)

    def _publish_lost(self, generation: int, silent: Silent) -> None:
        """The heartbeat thread saw ``silent.rank`` stop: publish the verdict (first writer wins)."""
        who = self._get_now(self._key(generation, f"claim/{silent.rank}"))
        verdict = _messages.rank_lost(
            rank=silent.rank,
            claimant=Claimant.describe(who) if who else "an unknown process",
            silent_for=silent.silent_for,
            last_seen=silent.last_seen(),
            master=self.master,
            generation=generation,
            local_rank=self.rank,
        )
        logger.debug("rank %d: %s", self.rank, verdict.what)
        self.store.compare_set(self._key(generation, "state"), "", _messages.verdict_to_json(verdict))

    def _read_verdict(self, generation: int, state: str) -> RendezvousError:
        self.stop_beating()
        # If the host is gone already, the verdict text is what matters.
        with contextlib.suppress(dist.DistError):
            self.store.add(self._key(generation, "seen"), 1)
        verdict = _messages.verdict_from_json(state, rank=self.rank)
        # A lost rank never reads the verdict: do not wait for it.
        self._linger(generation, absent=len(verdict.ranks) if isinstance(verdict, RankLostError) else 0)
        return verdict

    def _linger(self, generation: int, *, absent: int = 0) -> None:
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
            if seen >= joined - absent:
                return
            time.sleep(0.05)


def _log_waiting(join: JoinProtocol, generation: int, *, missing: list[int], waited: float) -> None:
    """The rate-limited progress record while ranks are missing (a warning when they may never come)."""
    hint = join.hint(missing)
    logger.log(
        logging.INFO if hint is None else logging.WARNING,
        "rank %d: waiting for ranks %s to join rendezvous %s (generation %d): %d/%d joined, %.0f s of %.0f s%s",
        join.rank,
        _messages._ranks(missing),
        join.master,
        generation,
        join.world_size - len(missing),
        join.world_size,
        waited,
        join.deadline,
        "" if hint is None else f"; {hint}",
        extra={
            "distinit": {
                "event": "init.waiting",
                "rank": join.rank,
                "generation": generation,
                "missing_ranks": missing[:64],
                "joined": join.world_size - len(missing),
                "world_size": join.world_size,
                "waited_s": round(waited, 1),
            }
        },
    )


def wait_for_key(
    store: Store,
    key: str,
    end: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    tick: Callable[[], None] = lambda: None,
) -> bool:
    """Wait until ``key`` exists on ``store`` or the monotonic time ``end``; True if it exists.

    ``sleep`` pauses between polls (and may raise to call the wait off); ``tick`` runs at every poll.

    Raises:
        torch.distributed.DistError: the store failed (other than a wait timing out).
    """
    first = min(FAST_WAIT, end - time.monotonic())
    if first > 0:
        try:
            store.wait([key], to_timedelta(first))
            return True
        except dist.DistStoreError:
            pass  # not yet: poll from now on
    while True:
        sleep(0.0)  # give the caller a chance to call the wait off
        tick()
        if store.check([key]):
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        sleep(min(left, POLL))
