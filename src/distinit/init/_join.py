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
* ``missing`` -- the ranks not joined yet, as ranges (``2-3,7``). Only rank 0 follows the arrivals (the
  new ``order/<n>`` entries since it last looked: O(N) keys over the whole join) and publishes this key when
  they change; every other rank reads this one key when it logs progress or names the missing ranks at the
  end of an attempt, so naming them costs the store O(N) reads in all, not O(N) per rank.
* ``state`` -- ``ok`` or a verdict (JSON), first writer wins, so every rank raises the SAME verdict. A verdict
  carries its writer's rank and the generation's token (a digest of the first ``world_size`` record, which
  every entered rank read); a value without them is refused (logged, removed), never raised. The store is
  unauthenticated (as torch's is): this stops garbage and stray writers, not a client that reads the token.
* ``state/ack/<rank>``, ``state/seen`` -- the ranks that know the verdict (its writer included), so the store
  host can linger just long enough: ``state`` is a :class:`distinit._board.Board`.
* ``init_verdict`` -- a verdict about ``init_process_group`` itself (gloo's loopback trap), a
  :class:`distinit._board.Board` that :mod:`distinit.init._form` writes and watches at
  :meth:`JoinProtocol.init_verdict_key`; ``pg/`` -- the process group's own keys (:meth:`JoinProtocol.prefix`).

Only this module spells these keys (:class:`Keys`, one generation's layout, built by :meth:`JoinProtocol.keys`;
``tests/unit/init/test_store_keys.py`` checks that no other module of ``init`` spells one): the heartbeat is handed
a :class:`Keys`, and the attempt machine and the group former ask the join for them
(:meth:`JoinProtocol.claimed`, :meth:`JoinProtocol.wait_for_state`, :meth:`JoinProtocol.init_verdict_key`), and
when the store fails while this rank waits, the join says what that means (:meth:`JoinProtocol.store_failed`:
:class:`HostSilent`, :class:`Frozen` or None) rather than how it beats.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from torch.distributed import Store

from distinit._board import Board, text
from distinit._duration import wait_bound
from distinit.errors import RankLostError, RendezvousError, WorldSizeMismatchError
from distinit.init import _messages
from distinit.init._heartbeat import Heartbeat, Silent, follow_arrivals
from distinit.init._policy import FIRST_POLL, GROWTH, POLL, AttemptFailed, Pace
from distinit.init._thread import Abandoned

logger = logging.getLogger("distinit.init")

#: Seconds before the first "waiting for ranks" progress record, and between later ones.
PROGRESS_FIRST = 10.0
PROGRESS_EVERY = 30.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


@dataclass(frozen=True)
class HostSilent:
    """The store failed while this rank waited in an incomplete join with rank 0 in it: its host may be gone.

    ``claimant``: rank 0 as ``host pid N`` (what the error names if the probes of its port find it gone);
    ``stale``: this join's loss bound in seconds, which the probes of its port take before they call it gone.
    """

    claimant: str
    stale: float


@dataclass(frozen=True)
class Frozen:
    """The store failed after this rank could not beat for longer than the loss bound: it was declared lost.

    Rank 0 published that verdict about this rank and left; the verdict is about this rank, never rank 0.
    ``claimant``: this rank as ``host pid N``; ``frozen_for`` and ``stale`` (the loss bound) in seconds.
    """

    claimant: str
    frozen_for: float
    stale: float


@dataclass(frozen=True)
class Keys:
    """One generation's keys on the store: the single place the join's key layout is spelled.

    ``root`` is ``<namespace>g<generation>/``; every key of the module docstring's list is ``root`` plus its
    name. :meth:`JoinProtocol.keys` builds it; the heartbeat (:mod:`distinit.init._heartbeat`, below this
    module in the import order) is handed one and reads its keys through it (its ``BeatKeys`` protocol), so
    no other module spells a join key. The strings are the wire format: ranks of one distinit version read
    each other's keys, so they never change within a version.
    """

    root: str

    def claim(self, rank: int) -> str:
        """``claim/<rank>``: ``host|pid|nonce`` of the process that claimed ``rank``."""
        return f"{self.root}claim/{rank}"

    def beat(self, rank: int) -> str:
        """``beat/<rank>``: ``seq|wall clock``, the rank's liveness while it waits in the join."""
        return f"{self.root}beat/{rank}"

    def order(self, n: int) -> str:
        """``order/<n>``: the rank that was the ``n``-th (1-based) to join."""
        return f"{self.root}order/{n}"

    @property
    def joined(self) -> str:
        """``joined``: the counter of joined ranks."""
        return f"{self.root}joined"

    @property
    def world_size(self) -> str:
        """``world_size``: ``size|rank|claimant`` of the first rank to record one (first writer wins)."""
        return f"{self.root}world_size"

    @property
    def missing(self) -> str:
        """``missing``: the ranks not joined yet, as ranges, published by rank 0."""
        return f"{self.root}missing"

    @property
    def state(self) -> str:
        """``state``: ``ok`` or the verdict (a :class:`~distinit._board.Board`)."""
        return f"{self.root}state"

    @property
    def init_verdict(self) -> str:
        """``init_verdict``: the verdict about ``init_process_group`` itself (a Board of ``_form``'s)."""
        return f"{self.root}init_verdict"

    @property
    def pg(self) -> str:
        """``pg``: the prefix of the process group's own keys."""
        return f"{self.root}pg"


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
        loss_bound: float | None = None,
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
        # The launcher's own count (DistEnv.launched, in words), and (missing count, since when) for the hint.
        self.launched = launched
        self._arrivals: tuple[int, float] | None = None
        self.pace = Pace.for_world(world_size, loss_bound=loss_bound)
        # Rank 0 only: the ranks that joined, in join order, and how many of them ``missing`` was published for.
        self._arrived: list[int] = []
        self._published: int | None = None
        # generation -> its token (a digest of the first world-size record): verdicts carry it.
        self._tokens: dict[int, str] = {}
        # Ranks other than 0: rank 0's claim in the generation this rank waits in, read by the waiting thread
        # itself (never left to the heartbeat thread's timing), and when to look again while it has none.
        self._host_claim: str | None = None
        self._next_host_look = 0.0

    # keys -----------------------------------------------------------------------------------------
    def keys(self, generation: int) -> Keys:
        """``generation``'s keys (the layout of the module docstring)."""
        return Keys(f"{self.namespace}g{generation}/")

    @property
    def _generation_key(self) -> str:
        """The call's generation counter, ``<namespace>generation`` (outside every generation's keys)."""
        return f"{self.namespace}generation"

    def prefix(self, generation: int) -> str:
        """Prefix for the process group's own keys in ``generation``."""
        return self.keys(generation).pg

    def init_verdict_key(self, generation: int) -> str:
        """The key of ``generation``'s init verdict (a :class:`~distinit._board.Board` of ``_form``'s)."""
        return self.keys(generation).init_verdict

    def claimed(self, generation: int, rank: int) -> bool:
        """Whether some process claimed ``rank`` in ``generation``."""
        return self.store.check([self.keys(generation).claim(rank)])

    def wait_for_state(self, generation: int, end: float, *, stop: threading.Event | None = None) -> bool:
        """Wait until ``generation``'s ``state`` is set (the world completed, or a verdict) or ``end``; True if set.

        Polls at this world's pace (see :func:`wait_for_key`).

        Raises:
            Abandoned: ``stop`` was set.
            RuntimeError: the store failed (torch's DistError, torch 2.2+).
        """
        return wait_for_key(self.store, self.keys(generation).state, end, stop=stop, poll=self.pace.poll)

    def generation(self) -> int:
        """The current generation (created as 0 by the first rank to ask)."""
        return int(text(self.store.compare_set(self._generation_key, "", "0")))

    def abandon(self, generation: int) -> None:
        """Move every rank on to ``generation + 1`` (no-op if someone already did)."""
        key = self._generation_key
        self.store.compare_set(key, str(generation), str(generation + 1))

    def _get_now(self, key: str) -> str | None:
        if not self.store.check([key]):
            return None
        return text(self.store.get(key))

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
        state = self._get_now(self.keys(generation).state)
        if state is not None and state != "ok":
            if self._genuine(generation, state):
                raise self._read_verdict(generation, state)
            self._clear_forged(generation, state)
            state = None
        formed = state == "ok"  # a world that formed before this process came: a conflict is another job's
        self._agree(generation, formed=formed)
        claim_key = self.keys(generation).claim(self.rank)
        me = self.me.encode()
        # A resumed namespace may hold our own claim from the interrupted call before: counted then already.
        claimed_before = self.resumed and self.store.check([claim_key])
        holder = text(self.store.compare_set(claim_key, "", me))
        counted = claimed_before and holder == me
        takeover = False
        if holder != me:
            host, pid = holder.split("|")[:2]
            if (
                host == self.me.host
                and pid.isascii()
                and pid.isdigit()
                and int(pid) != self.me.pid
                and not _pid_alive(int(pid))
            ):
                # A crashed process of this rank on this host: take its claim over; it was already counted.
                takeover = text(self.store.compare_set(claim_key, holder, me)) == me
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
        recorded = text(self.store.compare_set(self.keys(generation).world_size, "", mine))
        self._tokens[generation] = _digest(recorded)
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
        self._host_claim, self._next_host_look = None, 0.0
        if self.rank != 0:
            # Before the first beat: a rank seen joined knows rank 0 if rank 0 had claimed by then (else the wait
            # looks again), so it can name rank 0 should its store die while this rank waits.
            self._look_for_host(generation)
        keys = self.keys(generation)
        heartbeat = Heartbeat(
            self.store,
            keys=keys,
            rank=self.rank,
            lost=lambda silent: self._publish_lost(generation, silent),
            beat=self.pace.beat,
            stale=self.pace.stale,
        )
        heartbeat.beat()  # before counting: whoever learns of this rank finds its beat
        if not counted:
            position = self.store.add(keys.joined, 1)
            self.store.set(keys.order(position), str(self.rank))
            if position >= self.world_size:
                self.store.compare_set(keys.state, "", "ok")
                return  # the last rank to join has nobody left to wait for
        self._heartbeat = heartbeat
        heartbeat.start()

    @property
    def host_claimant(self) -> str | None:
        """``host pid N`` of rank 0 once this rank saw its claim (names it if the store host dies while it waits).

        Read as this rank joins, before its first beat, then once per beat while it waits until rank 0 claimed,
        by the joining thread itself (never left to the heartbeat thread's timing); the heartbeat's reading counts
        too.
        """
        claim = self._host_claim
        if claim is None and self._heartbeat is not None:
            claim = self._heartbeat.host_claim
        return Claimant.describe(claim) if claim else None

    def frozen_for(self, at: float | None = None) -> float | None:
        """How long this rank could not beat, if longer than the loss bound (see ``Heartbeat.frozen_for``)."""
        return self._heartbeat.frozen_for(at) if self._heartbeat is not None else None

    def store_failed(self, at: float) -> HostSilent | Frozen | None:
        """The store failed at ``at`` (monotonic): what that means for a rank waiting in this join.

        :class:`Frozen`: this rank could not beat for longer than the loss bound up to ``at``, so rank 0 declared
        it lost. :class:`HostSilent`: rank 0 is in the join, so its host may be gone (the caller probes its port).
        Either way this rank stops beating. None: this rank does not wait in an incomplete join with rank 0 in it
        (it keeps beating, if it beats): the attempts handle the failure as any other.
        """
        claimant = self.host_claimant
        if not self.beating or claimant is None:
            return None
        frozen = self.frozen_for(at)
        self.stop_beating()
        if frozen is not None:
            return Frozen(claimant=self.me.describe(self.me.encode()), frozen_for=frozen, stale=self.pace.stale)
        return HostSilent(claimant=claimant, stale=self.pace.stale)

    @property
    def beating(self) -> bool:
        """Whether this rank joined a generation that is not complete yet (and still counts on it)."""
        return self._heartbeat is not None

    def stop_beating(self) -> None:
        """Stop this rank's heartbeat (the join completed, ended in a verdict, or was given up)."""
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()

    def wait(
        self,
        generation: int,
        timeout: float,
        *,
        sleep: Callable[[float], None] = time.sleep,
        stop: threading.Event | None = None,
    ) -> None:
        """Wait up to ``timeout`` seconds until every rank joined ``generation`` (see :func:`wait_for_key`).

        ``sleep`` pauses between polls; it may raise to call the wait off. ``stop``: set when the caller gave
        up; the wait then raises :class:`~distinit.init._thread.Abandoned` at once.

        Raises:
            AttemptFailed: (kind ``join``) not all ranks joined in time; names the missing ranks.
            RendezvousError: a verdict was published (the same on every rank).
        """
        key = self.keys(generation).state
        now = time.monotonic()
        end = now + max(timeout, 0.0)
        if self._waiting_since is None:
            self._waiting_since = now
            self._next_progress = now + PROGRESS_FIRST
        while True:
            if wait_for_key(
                self.store,
                key,
                end,
                sleep=sleep,
                stop=stop,
                tick=lambda: self._tick(generation),
                poll=self.pace.poll,
                quick=self.pace.quick,
            ):
                state: str | None = text(self.store.get(key))
            else:
                state = self._get_now(key)  # a last look: the last "ok" may have arrived as the wait ended
            if state is None:
                missing = tuple(self.missing(generation))
                raise AttemptFailed(
                    "join",
                    f"{self.world_size - len(missing)}/{self.world_size} ranks joined generation {generation}, "
                    f"missing ranks {_messages._ranks(missing)}",
                    missing_ranks=missing,
                )
            if state == "ok" or self._genuine(generation, state):
                break
            self._clear_forged(generation, state)
        self.stop_beating()
        if state != "ok":
            raise self._read_verdict(generation, state)

    def missing(self, generation: int) -> list[int]:
        """Ranks that have not joined ``generation`` (yet), as rank 0 last saw them.

        Rank 0 follows the arrivals and publishes them (see the module docstring); another rank reads the
        published ranges in one key, or, when rank 0 never published any (it is itself missing under an
        agent store), reads the arrival order itself once (O(N) keys in three round trips). A joined rank
        that died is not missing: its heartbeat names it (:class:`~distinit.errors.RankLostError`).
        """
        if self.rank == 0:
            return self._follow(generation)
        missing = self._published_missing(generation)
        if missing is None:
            arrived: list[int] = []
            follow_arrivals(self.store, self.keys(generation), arrived)
            missing = _absent(arrived, self.world_size)
        self._note(len(missing))
        return missing

    def _follow(self, generation: int) -> list[int]:
        """Rank 0: read the new arrivals and publish the missing ranks if they changed; the missing ranks."""
        follow_arrivals(self.store, self.keys(generation), self._arrived)
        missing = _absent(self._arrived, self.world_size)
        if self._published != len(self._arrived):
            self.store.set(self.keys(generation).missing, encode_ranks(missing))
            self._published = len(self._arrived)
        self._note(len(missing))
        return missing

    def _published_missing(self, generation: int) -> list[int] | None:
        """The missing ranks rank 0 published (one key), or None if it published none (or a bad value)."""
        published = self._get_now(self.keys(generation).missing)
        if published is None:
            return None
        try:
            return decode_ranks(published, self.world_size)
        except ValueError:
            logger.debug("rank %d: ignored a malformed missing-ranks key %r", self.rank, published[:80])
            return None

    def _note(self, missing: int) -> None:
        """Remember when the count of missing ranks last changed (the quiet period of :meth:`hint`)."""
        if self._arrivals is None or self._arrivals[0] != missing:
            self._arrivals = (missing, time.monotonic())

    def hint(self, missing: tuple[int, ...] | list[int], *, final: bool = False) -> str | None:
        """Why ``missing`` may never come (see :func:`_messages.oversized`); ``final``: for the verdict.

        The final wording depends only on facts every rank shares (the missing ranks, the launcher's count),
        so every rank that gives up words it alike; the progress log also waits for a quiet period.
        """
        quiet = time.monotonic() - self._arrivals[1] if self._arrivals is not None else 0.0
        quiet = math.inf if final else quiet
        return _messages.oversized(world_size=self.world_size, missing=missing, launched=self.launched, quiet_for=quiet)

    # internals ------------------------------------------------------------------------------------
    def _tick(self, generation: int) -> None:
        """At every poll: rank 0 keeps the missing ranks current, the others learn who rank 0 is; all log progress."""
        if self.rank == 0:
            self._follow(generation)
        else:
            self._look_for_host(generation)
        self._progress(generation)

    def _look_for_host(self, generation: int) -> None:
        """Read rank 0's claim once it exists (one ``check`` per beat until then), to name it if its store dies."""
        now = time.monotonic()
        if self._host_claim is not None or now < self._next_host_look:
            return
        self._next_host_look = now + self.pace.beat
        self._host_claim = self._get_now(self.keys(generation).claim(0))

    def _progress(self, generation: int) -> None:
        """The rate-limited progress record: rank 0's own view, else what rank 0 published (one read)."""
        now = time.monotonic()
        if self._next_progress is None or now < self._next_progress or self._waiting_since is None:
            return
        self._next_progress = now + PROGRESS_EVERY
        waited = now - self._waiting_since
        missing = self._follow(generation) if self.rank == 0 else self._published_missing(generation)
        if missing is not None:
            self._note(len(missing))
            _log_waiting(self, generation, missing=missing, waited=waited)
            return
        joined = self.store.add(self.keys(generation).joined, 0)  # rank 0 has not published: a count
        self._note(self.world_size - joined)
        _log_count(self, generation, joined=joined, waited=waited)

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

    def _token(self, generation: int) -> str:
        """``generation``'s token: a digest of its first world-size record (every entered rank read it)."""
        token = self._tokens.get(generation)
        if token is None:
            recorded = self._get_now(self.keys(generation).world_size)
            if recorded is None:
                return ""  # nobody agreed on a world size yet: no verdict can exist
            token = self._tokens[generation] = _digest(recorded)
        return token

    def _genuine(self, generation: int, state: str) -> bool:
        """Whether ``state`` is a verdict a rank of this group wrote (this generation's token, a valid writer)."""
        return _messages.verdict_origin(state, token=self._token(generation), world_size=self.world_size)

    def _clear_forged(self, generation: int, state: str) -> None:
        """Refuse a state value no rank of this group wrote: log it, remove it, restore ``ok`` if complete."""
        key = self.keys(generation).state
        logger.warning(
            "rank %d: refused %r in the rendezvous state key %s: not a verdict of this group (no generation token "
            "or writer rank); something other than this job's ranks writes to the store at %s",
            self.rank,
            state[:80],
            key,
            self.master,
            extra={"distinit": {"event": "init.forged_state", "rank": self.rank, "generation": generation}},
        )
        self.store.delete_key(key)
        if self.store.add(self.keys(generation).joined, 0) >= self.world_size:
            self.store.compare_set(key, "", "ok")

    def _board(self, generation: int) -> Board:
        """``generation``'s ``state`` key as the verdict board."""
        return Board(self.store, self.keys(generation).state, rank=self.rank, world_size=self.world_size)

    def _put_state(self, generation: int, verdict: str) -> str:
        """Publish ``verdict`` as the state (first writer wins; a forged value is refused first): the state now."""
        board = self._board(generation)
        state = board.publish(verdict)
        if state not in (verdict, "ok") and not self._genuine(generation, state):
            self._clear_forged(generation, state)
            state = board.publish(verdict)
        return state

    def _publish(self, generation: int, verdict: RendezvousError) -> NoReturn:
        mine = _messages.verdict_to_json(verdict, writer=self.rank, token=self._token(generation))
        state = self._put_state(generation, mine)
        if state in (mine, "ok"):
            # Ours is the verdict (or the world formed without this process): raise it here.
            self._saw(generation)
            self._linger(generation, verdict)
            raise verdict
        raise self._read_verdict(generation, state)

    def fail(self, generation: int, verdict: RendezvousError) -> NoReturn:
        """This rank met a failure no retry cures: publish ``verdict`` for every rank and raise it.

        First writer wins: if another verdict is already published, that one is raised instead.
        """
        self.stop_beating()
        self._publish(generation, verdict)

    def _publish_lost(self, generation: int, silent: Silent) -> None:
        """The heartbeat thread saw ``silent.rank`` stop: publish the verdict (first writer wins)."""
        who = self._get_now(self.keys(generation).claim(silent.rank))
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
        self._put_state(generation, _messages.verdict_to_json(verdict, writer=self.rank, token=self._token(generation)))

    def _read_verdict(self, generation: int, state: str) -> RendezvousError:
        self.stop_beating()
        self._saw(generation)
        verdict = _messages.verdict_from_json(state, rank=self.rank)
        # A lost rank may only be frozen: when it resumes within the linger, it reads the verdict about itself.
        self._linger(generation, verdict)
        return verdict

    def _saw(self, generation: int) -> None:
        """Count this rank among those that know the verdict (if the host is gone, the text is what matters)."""
        with contextlib.suppress(RuntimeError):
            self._board(generation).acknowledge()

    def _linger(self, generation: int, verdict: RendezvousError) -> None:
        """On the store host: stay up until every rank learned ``verdict`` (:meth:`distinit._board.Board.linger`).

        Every rank, joined or not: a rank refused before it counted (a world-size mismatch, a duplicate), one
        still connecting, a late one, or a lost rank that was only frozen and resumes learns the verdict only
        while the store is up. When some ranks may never read it (the lost ranks of a :class:`RankLostError`;
        a mismatch, where the host cannot know which size is true), the host leaves earlier: once every
        joined rank but the lost ones knows and nobody new learned it for a quiet second.
        """
        if not self.hosting:
            return
        lost = isinstance(verdict, RankLostError)
        absent = len(verdict.ranks) if lost else 0
        joined_key = self.keys(generation).joined

        def settled(seen: int) -> bool:
            return seen >= self.store.add(joined_key, 0) - absent

        unsure = lost or isinstance(verdict, WorldSizeMismatchError)
        self._board(generation).linger(settled=settled if unsure else lambda seen: False)


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


def _log_count(join: JoinProtocol, generation: int, *, joined: int, waited: float) -> None:
    """The progress record of a rank that only knows how many joined (rank 0 has not published who)."""
    logger.info(
        "rank %d: waiting for %d more rank(s) to join rendezvous %s (generation %d): %d/%d joined, %.0f s of %.0f s",
        join.rank,
        join.world_size - joined,
        join.master,
        generation,
        joined,
        join.world_size,
        waited,
        join.deadline,
        extra={
            "distinit": {
                "event": "init.waiting",
                "rank": join.rank,
                "generation": generation,
                "joined": joined,
                "world_size": join.world_size,
                "waited_s": round(waited, 1),
            }
        },
    )


def _digest(recorded: str) -> str:
    """A generation token from its world-size record (``size|rank|host|pid|nonce`` of the first rank)."""
    return hashlib.blake2b(recorded.encode(), digest_size=8).hexdigest()


def _absent(arrived: Sequence[int], world_size: int) -> list[int]:
    """The ranks of ``range(world_size)`` not in ``arrived``, in order."""
    present = set(arrived)
    return [r for r in range(world_size) if r not in present]


def encode_ranks(ranks: Sequence[int]) -> str:
    """Sorted ranks as ranges: ``[2, 3, 4, 7]`` -> ``"2-4,7"`` (empty string for none)."""
    parts: list[str] = []
    start = prev = None
    for r in ranks:
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def decode_ranks(text: str, world_size: int) -> list[int]:
    """Ranges written by :func:`encode_ranks` back to ranks, each checked against ``world_size``.

    Raises:
        ValueError: ``text`` is not ascending ranges of ranks below ``world_size``.
    """
    out: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if not (out[-1] if out else -1) < low <= high < world_size:
            raise ValueError(f"{part!r} is not a range of ranks above {out[-1] if out else -1} and below {world_size}")
        out.extend(range(low, high + 1))
    return out


class PauseSchedule:
    """Pauses between polls of one wait: ``quick`` pauses of ``first``, then doubling, at most ``longest``.

    ``first`` is ``longest`` x ``FIRST_POLL`` / ``POLL`` (5 ms at the base interval; constants of
    :mod:`distinit.init._policy`): a large world, whose joins take longer anyway, does not spend its first
    second on polls that cannot succeed yet; a small one polls ``quick`` times at ``first`` (``Pace.quick``).
    """

    def __init__(self, longest: float, quick: int = 1) -> None:
        self.longest = longest
        self._next = longest * FIRST_POLL / POLL
        self._quick = max(quick, 1)

    def next(self) -> float:
        """The next pause (after the quick ones, :data:`~distinit.init._policy.GROWTH` times the last)."""
        pause = self._next
        self._quick -= 1
        if self._quick <= 0:
            self._next = min(pause * GROWTH, self.longest)
        return pause


def wait_for_key(
    store: Store,
    key: str,
    end: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    stop: threading.Event | None = None,
    tick: Callable[[], None] = lambda: None,
    poll: float = POLL,
    quick: int = 1,
) -> bool:
    """Wait until ``key`` exists on ``store`` or the monotonic time ``end``; True if it exists.

    Polls with ``check`` (one round trip) at growing pauses, from a few milliseconds (``quick`` times) up to
    ``poll`` s (see :class:`PauseSchedule`): a key set within milliseconds is seen within milliseconds,
    and a long wait costs the store one check per ``poll``. No blocking store ``wait``: it cannot be called
    off, and c10d logs a "waitForInput ... timed out" warning each time one times out. ``sleep`` pauses
    between polls (and may raise to call the wait off); ``stop``, once set, calls it off with
    :class:`~distinit.init._thread.Abandoned`; ``tick`` runs at every poll.

    Raises:
        RuntimeError: the store failed (torch's DistError, torch 2.2+).
    """
    pauses = PauseSchedule(poll, quick)

    def pause(seconds: float) -> None:
        if stop is None:
            sleep(seconds)
        elif stop.wait(wait_bound(seconds)):
            raise Abandoned

    while True:
        pause(0.0)  # give the caller a chance to call the wait off
        tick()
        if store.check([key]):
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        pause(min(left, pauses.next()))
