"""Liveness of joined ranks: a rank that joined and then stopped ends the rendezvous in seconds.

While a rank waits in the join it beats ``g<generation>/beat/<rank>`` (``seq|wall clock``) every ``beat``
s (:class:`~distinit.init._policy.Pace`: 1 s up to 1,000 ranks, longer above) from a daemon thread; the
beat stops once the join completes or is given up. Rank 0 watches every joined rank (it learns them from
``g<generation>/order/<n>``, written by the n-th joiner, so one watch costs a few round trips whatever the
world size); the other ranks watch rank 0 (the store host under torchrun's agent store can outlive it). A
beat that has not changed for ``stale`` s (5 s, or five beats when beats are longer), as seen by the
watcher's own clock (no clock skew between hosts matters), means the rank died, was interrupted or froze:
the watcher publishes a :class:`~distinit.errors.RankLostError` verdict, so every rank raises the same
error naming it. Ranks that never arrived are not watched: they keep the late-worker patience of the
deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

import torch.distributed as dist
from torch.distributed import Store

from distinit._board import Board, text
from distinit._duration import wait_bound
from distinit._net import ProbeResult, probe
from distinit.errors import RankLostError, RendezvousError
from distinit.init import _messages
from distinit.init._policy import BEAT, STALE, Pace, StoreSign, judge_store_host, loss_bound, store_sign
from distinit.init._store import Master

logger = logging.getLogger("distinit.init")


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
    """

    def __init__(
        self,
        store: Store,
        *,
        prefix: str,
        rank: int,
        lost: Callable[[Silent], None],
        beat: float = BEAT,
        stale: float = STALE,
    ) -> None:
        self.store, self.prefix, self.rank = store, prefix, rank
        self._lost, self._beat_every, self._stale = lost, beat, stale
        self._seq = 0
        self._stop = threading.Event()
        self._known: list[int] = []  # watched ranks, in join order (rank 0 only)
        self._seen: dict[int, tuple[bytes, float]] = {}  # rank -> (beat value, monotonic time it changed)
        self._thread: threading.Thread | None = None
        #: Rank 0's claim (``host|pid|nonce``) once a non-zero rank watches it.
        self.host_claim: str | None = None
        #: Monotonic time of this rank's last written beat: a long gap since means this process was frozen.
        self.last_beat = time.monotonic()
        self._frozen = 0.0  # the longest gap between two beats seen so far (s)

    def beat(self) -> None:
        """Write one beat now (the first one is written before the rank counts as joined)."""
        self._seq += 1
        self.store.set(f"{self.prefix}beat/{self.rank}", f"{self._seq}|{time.time():.3f}")
        self.last_beat = time.monotonic()

    def frozen_for(self, at: float | None = None) -> float | None:
        """The longest time this rank could not beat (until ``at``, or between two beats), if past the loss bound.

        Such a rank was frozen (SIGSTOP, a thread holding the GIL, swapped out): its watchers declared it lost.
        ``at``: when the store failed (monotonic; default now): the beats that could not be written after it
        are no freeze. None when it was not frozen.
        """
        gap = max((time.monotonic() if at is None else at) - self.last_beat, self._frozen)
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
                gap = time.monotonic() - self.last_beat
                if gap > self._stale / 2:
                    # This process did not run for a while: what it did not see is no sign of the others.
                    self._seen.clear()
                    self._frozen = max(self._frozen, gap)  # past the loss bound: the others declared it lost
                self.beat()
                silent = self._watch()
                if silent is not None and not self._stop.is_set():
                    self._lost(silent)
                    return
        except (dist.DistError, RuntimeError, OSError, ValueError, RendezvousError) as exc:
            # The store went away, or holds keys distinit did not write: the main thread sees that too.
            logger.debug("rank %d: heartbeat stopped: %s", self.rank, exc)
        finally:
            self.store = None  # type: ignore[assignment]  # let go of the store (rank 0: its server)

    def _watch(self) -> Silent | None:
        ranks = self._ranks()
        if not ranks:
            return None
        values = self.store.multi_get([f"{self.prefix}beat/{r}" for r in ranks])
        now = time.monotonic()
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
            if not self._known and self.store.check([f"{self.prefix}beat/0"]):
                claim = self.store.get(f"{self.prefix}claim/0")  # written before its first beat
                self.host_claim = claim.decode(errors="replace") if isinstance(claim, bytes) else str(claim)
                self._known.append(0)
            return self._known
        follow_arrivals(self.store, self.prefix, self._known)
        return [r for r in self._known if r != self.rank]


def follow_arrivals(store: Store, prefix: str, known: list[int]) -> None:
    """Append to ``known`` (ranks in join order) the ranks that joined since it was last followed.

    Reads the ``joined`` counter, then the new ``order/<n>`` entries in one ``check`` and one ``multi_get``,
    so following a whole join costs O(N) keys in all, not O(N) per call. An entry not written yet (its
    joiner is between counting and writing it) ends the batch; the next call picks it up.

    Raises:
        RendezvousError: an order entry is not a rank number: something other than distinit writes to this
            store (only distinit's join writes these keys), so no arrival it records can be trusted.
    """
    joined = store.add(f"{prefix}joined", 0)
    keys = [f"{prefix}order/{n}" for n in range(len(known) + 1, joined + 1)]
    if keys and not store.check(keys):
        ready = 0
        while ready < len(keys) and store.check([keys[ready]]):
            ready += 1
        keys = keys[:ready]
    if keys:
        values = store.multi_get(keys)
        bad = next((k for k, v in zip(keys, values, strict=True) if not v.isdigit()), None)
        if bad is not None:
            raise RendezvousError(
                f"the store's join key {bad} holds {bytes(values[keys.index(bad)])[:40]!r}, not a rank number",
                why="only distinit's join writes these keys: another program writes to this rendezvous's store.",
                fix="stop the program writing to MASTER_PORT's store, or pick another port for this job.",
            )
        known.extend(int(value) for value in values)


#: The last beat of a rank whose watch stopped on purpose (teardown(), or its group destroyed).
BYE = "bye"

#: What a failed collective says when a peer went away (gloo's and NCCL's wordings; matched, never parsed).
PEER_CLOSED = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ncclRemoteError|remote process exited"
    r"|NCCL communicator was aborted",
    re.IGNORECASE,
)


def peer_closed(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a collective that failed because a peer went away (gloo or NCCL)."""
    return isinstance(exc, (RuntimeError, dist.DistError)) and PEER_CLOSED.search(str(exc)) is not None


class Liveness:
    """After :func:`distinit.setup`: who every rank is (host, pid) and when it last beat, cheap to consult.

    One daemon thread per rank writes ``who/<rank>`` (``host|pid``) once and ``beat/<rank>`` every
    ``pace.beat`` s on the group's own store (keys under the default group's prefix, so a new group starts
    clean). Rank 0 reads every rank's beat in one ``multi_get`` per beat and the others read rank 0's, so
    the store serves about 2 operations per rank per beat (the join's own pace, :class:`~._pace.Pace`);
    a watched rank silent for ``pace.stale`` s is logged at WARNING, naming its rank, host, pid and last
    beat, even while this rank is blocked in a collective that will never complete. When a collective
    fails because a peer went away, :meth:`lost` names it: a dead pid on this host at once, else the
    ranks whose beat stops advancing within two beats, else (the store itself gone) rank 0. A non-zero
    rank reads rank 0's ``who`` once, so it can name rank 0 after its store is gone.
    """

    def __init__(self, store: Store, *, rank: int, world_size: int, beat: float, stale: float) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self._beat_every, self._stale = beat, stale
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._who: dict[int, str] = {}  # rank -> "host|pid", as read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0

    @property
    def _board(self) -> Board:
        """The ``lost`` key: who went away, published by the first rank that knew (built on use: no store kept)."""
        return Board(self.store, "lost", rank=self.rank, world_size=self.world_size)

    @classmethod
    def started(cls, store: Store, *, rank: int, world_size: int, environ: Mapping[str, str]) -> Liveness:
        """A started watch at the join's pace for ``world_size`` (and the loss bound ``environ`` sets)."""
        pace = Pace.for_world(world_size, loss_bound=loss_bound(environ))
        liveness = cls(store, rank=rank, world_size=world_size, beat=pace.beat, stale=pace.stale)
        liveness.start()
        return liveness

    def start(self) -> None:
        """Start the thread (its first act writes who this rank is)."""
        self._thread = threading.Thread(target=self._run, name=f"distinit-liveness-rank{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and watching (before the group and its store are destroyed).

        The thread's last act is a ``bye`` beat, so watchers know this rank left on purpose: a rank that
        finished and called ``teardown()`` is no "stopped" warning on a rank 0 that is still saving a
        checkpoint. Written by the thread, the join below bounds what a dead store can cost at exit.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_bound(0.5))
        self.store = None  # type: ignore[assignment]  # let go of the store (rank 0: its server)

    def _run(self) -> None:
        try:
            self.store.set(f"who/{self.rank}", f"{self.host}|{self.pid}")
            seen: dict[int, tuple[bytes, float]] = {}
            warned: set[int] = set()
            while True:
                if self.rank != 0 and 0 not in self._who and self.store.check(["who/0"]):
                    self._who[0] = text(self.store.get("who/0"))
                self._seq += 1
                self.store.set(f"beat/{self.rank}", f"{self._seq}|{time.time():.3f}")
                watched = [r for r in (range(self.world_size) if self.rank == 0 else (0,)) if r != self.rank]
                for silent in self._silent(watched, seen, self._stale):
                    if silent.rank not in warned:
                        warned.add(silent.rank)
                        self._warn(silent)
                if self._stop.wait(self._beat_every) or not dist.is_initialized():
                    # stopped, or the group was destroyed without teardown(): say so, then let go of its store
                    self.store.set(f"beat/{self.rank}", BYE)
                    return
        except (dist.DistError, RuntimeError, OSError, ValueError, AttributeError) as exc:
            # The store went away (or was let go of by stop()): nothing left to watch.
            if not self._stop.is_set():
                logger.debug("rank %d: liveness watch stopped: %s", self.rank, exc)
        finally:
            if not dist.is_initialized():
                self.store = None  # type: ignore[assignment]  # the group is gone: free its store (rank 0: the server)

    def _silent(self, ranks: list[int], seen: dict[int, tuple[bytes, float]], stale: float) -> list[Silent]:
        """The ``ranks`` whose beat has not changed for ``stale`` s as seen here (``seen`` is updated)."""
        present = [r for r in ranks if r in seen]
        if len(present) < len(ranks):
            present = self._present(ranks, "beat")
        if not present:
            return []
        values = self.store.multi_get([f"beat/{r}" for r in present])
        now, out = time.monotonic(), []
        for rank, value in zip(present, values, strict=True):
            if value == BYE.encode():  # left on purpose (teardown): never silent, never lost
                seen.pop(rank, None)
                continue
            before = seen.get(rank)
            if before is None or before[0] != value:
                seen[rank] = (value, now)
            elif now - before[1] >= stale:
                out.append(Silent(rank, silent_for=now - before[1], last_wall=_wall(value)))
        return out

    def _present(self, ranks: list[int], name: str) -> list[int]:
        """The ``ranks`` whose ``<name>/<rank>`` key exists: one round trip when all do, else one per rank."""
        if not ranks or self.store.check([f"{name}/{r}" for r in ranks]):
            return ranks
        return [r for r in ranks if self.store.check([f"{name}/{r}"])]

    def describe(self, rank: int) -> str:
        """``rank 1 (host gpu-b, pid 902)``, from ``who/<rank>`` (read once), or just ``rank 1``."""
        who = self._who.get(rank)
        if who is None:
            with contextlib.suppress(dist.DistError, RuntimeError, OSError, AttributeError):
                if self.store.check([f"who/{rank}"]):
                    who = self._who[rank] = text(self.store.get(f"who/{rank}"))
        if who is None:
            return f"rank {rank}"
        host, _, pid = who.partition("|")
        return f"rank {rank} (host {host}, pid {pid})"

    def _warn(self, silent: Silent) -> None:
        logger.warning(
            "rank %d: %s stopped: no heartbeat for %.1f s (last seen %s); a collective with it will fail or hang",
            self.rank,
            self.describe(silent.rank),
            silent.silent_for,
            silent.last_seen(),
            extra={"distinit": {"event": "init.peer_lost", "rank": self.rank, "lost_rank": silent.rank}},
        )

    def lost(self, bound: float) -> str | None:
        """Who went away, in words (rank, host, pid, last seen), the same on every rank; within ``bound`` s.

        A rank on this host whose pid is gone is certain at once and is published on the store (first
        finder wins, so every rank words it alike); the others take the published finding, or name the
        ranks whose beat stops advancing within two beats; if the store itself fails, its host, rank 0.
        None when nothing was found in time.
        """
        end = time.monotonic() + bound
        try:
            keys = [f"who/{r}" for r in range(self.world_size)]
            present = self._present([r for r in range(self.world_size) if r != self.rank], "who")
            values = self.store.multi_get([keys[r] for r in present]) if present else []
            self._who.update((r, text(value)) for r, value in zip(present, values, strict=True))
            dead = sorted(r for r, who in self._who.items() if _gone_here(who, self.host))
            if dead:
                beats = self.store.multi_get([f"beat/{r}" for r in dead])
                found = "; ".join(
                    f"{self.describe(r)}: its process is gone (seen by rank {self.rank}; last heartbeat "
                    f"{Silent(r, silent_for=0.0, last_wall=_wall(beat)).last_seen()})"
                    for r, beat in zip(dead, beats, strict=True)
                )
                return self._board.publish(found) or found
            seen: dict[int, tuple[bytes, float]] = {}
            peers = [r for r in range(self.world_size) if r != self.rank]
            self._silent(peers, seen, 0.0)
            quiet_end = time.monotonic() + 2 * self._beat_every + 0.5
            while time.monotonic() < end:
                published = self._board.read()
                if published is not None:
                    return published
                silent = self._silent(peers, seen, 2 * self._beat_every)
                if silent or time.monotonic() >= quiet_end:
                    return (
                        "; ".join(f"{self.describe(s.rank)}: no heartbeat since {s.last_seen()}" for s in silent)
                        or None
                    )
                time.sleep(min(0.1, self._beat_every))
            return None
        except (dist.DistError, RuntimeError, OSError, AttributeError):  # AttributeError: the store was let go of
            return f"{self.describe(0)}: the store it hosts stopped answering (its process is gone or frozen)"
        finally:
            with contextlib.suppress(dist.DistError, RuntimeError, OSError):
                self._board.acknowledge()

    def linger(self, bound: float) -> None:
        """Rank 0 (the store host): stay up until the other ranks consulted :meth:`lost`, or ``bound`` s.

        Leaves once the count stops growing for a second (the lost ranks never consult).
        """
        self._board.linger(bound=bound, settled=lambda seen: True)


def _wall(beat: bytes) -> float | None:
    """The wall clock of a ``seq|wall`` beat value, if it is one."""
    wall = beat.decode(errors="replace").partition("|")[2]
    return float(wall) if wall.replace(".", "", 1).isdigit() else None


def _gone_here(who: str, host: str) -> bool:
    """``host|pid`` names a process of this host that no longer exists."""
    where, _, pid = who.partition("|")
    if where != host or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- host_lost: The store host (rank 0) died after this rank joined: say so in seconds instead of "missing ranks [0]"
# later.
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
