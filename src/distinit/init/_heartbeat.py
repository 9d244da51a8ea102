"""Liveness of joined ranks: a rank that joined and then stopped ends the rendezvous in seconds.

While a rank waits in the join it beats its ``beat/<rank>`` key (``seq|wall clock``) every ``beat``
s (:class:`~distinit.init._policy.Pace`: 1 s up to 1,000 ranks, longer above) from a daemon thread; the
beat stops once the join completes or is given up. Rank 0 watches every joined rank (it learns them from
the ``order/<n>`` keys, written by the n-th joiner, so one watch costs a few round trips whatever the
world size); the other ranks watch rank 0 (the store host under torchrun's agent store can outlive it). A
beat that has not changed for ``stale`` s (5 s, or five beats when beats are longer), as seen by the
watcher's own clock (no clock skew between hosts matters), means the rank died, was interrupted or froze:
the watcher publishes a :class:`~distinit.errors.RankLostError` verdict, so every rank raises the same
error naming it. Ranks that never arrived are not watched: they keep the late-worker patience of the
deadline.

The keys are the join's (:class:`distinit.init._join.Keys` spells them, one generation's, and the join hands
them over as a :class:`BeatKeys`): this module spells no store key.

Its parts: :class:`Heartbeat` (the beat and the watch while a rank waits in the join), :func:`follow_arrivals`
(rank 0 learns who joined, in join order), and :func:`host_gone`: the store host (rank 0) died after this rank
joined, said in seconds instead of "missing ranks [0]" later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Protocol

from torch.distributed import Store

from distinit._duration import wait_bound
from distinit._net import ProbeResult, probe
from distinit.errors import RankLostError, RendezvousError
from distinit.init import _messages
from distinit.init._policy import BEAT, STALE, StoreSign, judge_store_host, store_sign
from distinit.init._store import Master

logger = logging.getLogger("distinit.init")


class BeatKeys(Protocol):
    """The join's keys the heartbeat reads and writes, for one generation.

    The join owns the key layout: :class:`distinit.init._join.Keys` spells every key (this module, below
    ``_join`` in the import order, spells none) and :meth:`distinit.init._join.JoinProtocol.keys` builds the
    value handed here.
    """

    def beat(self, rank: int) -> str:
        """The key ``rank`` beats while it waits in the join."""
        ...

    def claim(self, rank: int) -> str:
        """The key holding ``rank``'s claimant (``host|pid|nonce``)."""
        ...

    def order(self, n: int) -> str:
        """The key naming the ``n``-th rank to join (1-based)."""
        ...

    @property
    def joined(self) -> str:
        """The counter of joined ranks."""
        ...


class Silent:
    """A watched rank whose beat stopped: how long ago its beat last changed, and its wall clock then."""

    def __init__(self, rank: int, *, silent_for: float, last_wall: float | None) -> None:
        self.rank = rank
        self.silent_for = silent_for
        self.last_wall = last_wall

    def last_seen(self) -> str:
        """``17:12:03 UTC`` (the rank's own clock at its last beat), or ``unknown``."""
        if self.last_wall is None:
            return "unknown"
        return datetime.fromtimestamp(self.last_wall, tz=timezone.utc).strftime("%H:%M:%S UTC")


class Heartbeat:
    """Beat this rank's key and watch the others' in one daemon thread, for one generation.

    ``lost(silent)`` runs once, in the thread, when a watched rank went silent; it publishes the verdict.
    ``clock``: this rank's monotonic clock, by which every silence and freeze is judged (the tests give a fake).
    """

    def __init__(
        self,
        store: Store,
        *,
        keys: BeatKeys,
        rank: int,
        lost: Callable[[Silent], None],
        beat: float = BEAT,
        stale: float = STALE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.keys, self.rank = store, keys, rank
        self._clock = clock
        self._lost, self._beat_every, self._stale = lost, beat, stale
        self._seq = 0
        self._stop = threading.Event()
        self._known: list[int] = []  # watched ranks, in join order (rank 0 only)
        self._seen: dict[int, tuple[bytes, float]] = {}  # rank -> (beat value, monotonic time it changed)
        self._thread: threading.Thread | None = None
        #: Rank 0's claim (``host|pid|nonce``) once a non-zero rank watches it.
        self.host_claim: str | None = None
        #: Monotonic time of this rank's last written beat: a long gap since means this process was frozen.
        self.last_beat = clock()
        self._frozen = 0.0  # the longest gap between two beats seen so far (s)

    def beat(self) -> None:
        """Write one beat now (the first one is written before the rank counts as joined)."""
        self._seq += 1
        self.store.set(self.keys.beat(self.rank), f"{self._seq}|{time.time():.3f}")
        self.last_beat = self._clock()

    def frozen_for(self, at: float | None = None) -> float | None:
        """The longest time this rank could not beat (until ``at``, or between two beats), if past the loss bound.

        Such a rank was frozen (SIGSTOP, a thread holding the GIL, swapped out): its watchers declared it lost.
        ``at``: when the store failed (monotonic; default now): the beats that could not be written after it
        are no freeze. None when it was not frozen.
        """
        gap = max((self._clock() if at is None else at) - self.last_beat, self._frozen)
        return gap if gap > self._stale else None

    def start(self) -> None:
        """Start the thread (after the first :meth:`beat`)."""
        self._thread = threading.Thread(target=self._run, name=f"distinit-heartbeat-rank{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and watching; waits briefly so the thread lets go of the store."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_bound(0.5))  # a thread stuck in a native store call is left (daemon)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._beat_every):
                silent = self.tick()
                if silent is not None and not self._stop.is_set():
                    self._lost(silent)
                    return
        except (RuntimeError, OSError, ValueError, RendezvousError) as exc:
            # The store went away, or holds keys distinit did not write: the main thread sees that too.
            logger.debug("rank %d: heartbeat stopped: %s", self.rank, exc)
        finally:
            self.store = None  # type: ignore[assignment]  # let go of the store (rank 0: its server)

    def tick(self) -> Silent | None:
        """One turn of the thread: beat, then look at the watched ranks; the first silent one, or None.

        A gap of more than half the loss bound since this rank's own last beat means this process did not run
        for a while (by its own clock): what it did not see then is no sign of the others, so their silences
        are counted afresh, and the gap is kept as a freeze (:meth:`frozen_for`: past the loss bound, the
        others declared this rank lost).
        """
        gap = self._clock() - self.last_beat
        if gap > self._stale / 2:
            self._seen.clear()
            self._frozen = max(self._frozen, gap)
        self.beat()
        return self._watch()

    def _watch(self) -> Silent | None:
        """The first watched rank whose beat has not changed for longer than the loss bound, by this clock."""
        ranks = self._ranks()
        if not ranks:
            return None
        values = self.store.multi_get([self.keys.beat(r) for r in ranks])
        now = self._clock()
        for rank, value in zip(ranks, values, strict=True):
            before = self._seen.get(rank)
            if before is None or before[0] != value:
                self._seen[rank] = (value, now)
            elif now - before[1] > self._stale:
                wall = value.decode(errors="replace").partition("|")[2]
                last_wall = float(wall) if wall.replace(".", "", 1).isdigit() else None
                return Silent(rank, silent_for=now - before[1], last_wall=last_wall)
        return None

    def _ranks(self) -> list[int]:
        """The ranks to watch: every joined rank (rank 0), else rank 0 once it joined."""
        if self.rank != 0:
            if not self._known and self.store.check([self.keys.beat(0)]):
                claim = self.store.get(self.keys.claim(0))  # written before its first beat
                self.host_claim = claim.decode(errors="replace") if isinstance(claim, bytes) else str(claim)
                self._known.append(0)
            return self._known
        follow_arrivals(self.store, self.keys, self._known)
        return [r for r in self._known if r != self.rank]


def follow_arrivals(store: Store, keys: BeatKeys, known: list[int]) -> None:
    """Append to ``known`` (ranks in join order) the ranks that joined since it was last followed.

    Reads the ``joined`` counter, then the new ``order/<n>`` entries in one ``check`` and one ``multi_get``,
    so following a whole join costs O(N) keys in all, not O(N) per call. An entry not written yet (its
    joiner is between counting and writing it) ends the batch; the next call picks it up.

    Raises:
        RendezvousError: an order entry is not a rank number: something other than distinit writes to this
            store (only distinit's join writes these keys), so no arrival it records can be trusted.
    """
    joined = store.add(keys.joined, 0)
    entries = [keys.order(n) for n in range(len(known) + 1, joined + 1)]
    if entries and not store.check(entries):
        ready = 0
        while ready < len(entries) and store.check([entries[ready]]):
            ready += 1
        entries = entries[:ready]
    if entries:
        values = store.multi_get(entries)
        bad = next((k for k, v in zip(entries, values, strict=True) if not v.isdigit()), None)
        if bad is not None:
            raise RendezvousError(
                f"the store's join key {bad} holds {bytes(values[entries.index(bad)])[:40]!r}, not a rank number",
                why="only distinit's join writes these keys: another program writes to this rendezvous's store.",
                fix="stop the program writing to MASTER_PORT's store, or pick another port for this job.",
            )
        known.extend(int(value) for value in values)


# Rank 0's store dies with it, so no heartbeat verdict can be published. A joined rank whose store call fails
# (whatever it raised) probes MASTER_ADDR:MASTER_PORT and lets :func:`~distinit.init._policy.judge_store_host`
# decide from what the probes saw since the failure: nothing served for the loss bound and nothing listens now
# means rank 0 is gone (a frozen host or a lost network answers differently, and a restarted rank 0 answers
# again); then it raises :class:`~distinit.errors.RankLostError` naming rank 0. A probe that meets the dying
# process's listener (accepted, then reset) is no sign of life.
#: Pause between two probes while deciding.
PROBE_EVERY = 0.25


def host_gone(
    master: Master,
    *,
    claimant: str,
    generation: int,
    since: float,
    end: float,
    sleep: Callable[[float], None],
    stale: float = STALE,
    probe_port: Callable[[], ProbeResult] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RankLostError | None:
    """Probe until the store host is judged gone (the error naming it) or not (None); never past ``end``.

    ``since``: the monotonic time this rank's store call failed (the count starts there); ``probe_port``: one
    probe of the master's port (default :func:`distinit._net.probe`; the tests give a scripted one).
    """
    if since + stale > end:
        return None  # no room to decide before the deadline: the deadline's error says it
    lost_wall = time.time() - (clock() - since)
    seen: list[StoreSign] = []
    while True:
        result = probe_port() if probe_port is not None else _probe(master, stale)
        seen.append(store_sign(result.kind, result.detail))
        since_failure = clock() - since
        logger.debug(
            "rank %d: store host %s %.2f s after the store failed: %s (%s)",
            master.rank,
            master.name,
            since_failure,
            result.kind,
            result.detail,
        )
        verdict = judge_store_host(seen, since_failure=since_failure, stale=stale)
        if verdict == "gone":
            break
        if verdict == "retry" or clock() + PROBE_EVERY >= end:
            return None  # something answers (a restarted rank 0) or the network fails: the attempts handle it
        sleep(PROBE_EVERY)
    return _messages.rank_lost(
        rank=0,
        claimant=claimant,
        silent_for=since_failure,
        last_seen=datetime.fromtimestamp(lost_wall, tz=timezone.utc).strftime("%H:%M:%S UTC"),
        master=master.name,
        generation=generation,
        local_rank=master.rank,
    )


def _probe(master: Master, stale: float) -> ProbeResult:
    return probe(master.addr, master.port, min(1.0, stale), handshake_timeout=1.0)
