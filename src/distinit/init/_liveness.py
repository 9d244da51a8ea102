"""After setup(): which rank stopped first when a collective fails because a peer went away, or "unknown".

A collective that fails with gloo's "Connection closed by peer" (or NCCL's remote errors) says that *some*
peer went away, not which one, and every survivor sees it at its own time: the neighbours of the dead rank
at once, the others only when a neighbour exits in turn (then the dead rank is two hops away), and when rank
0 leaves, its store goes with it. So the order in which survivors notice says nothing; distinit judges from
facts recorded while they happen:

* the liveness beats (``beat/<rank>``: ``seq|wall``, every ``pace.beat`` s from a daemon thread), so a rank
  whose beat stops for two beats stopped (died, froze or lost the network); ``bye`` is a rank that left
  through ``teardown()``;
* each rank's exit record (``exit/<rank>``: ``kind|wall|detail``), written at exit by ``teardown()`` before
  its last beat: ``peer`` -- it leaves because a collective failed on a peer (a consequence, never a culprit);
  ``error`` -- it leaves on an exception of its own (type and first line);
* on this host, whether a rank's pid is still a live process (a zombie is gone).

:func:`judge` (pure) names the culprit: the one rank that stopped without being a consequence, or the first of
several when its stop precedes the next by more than one beat and the margin; otherwise it says "unknown" and
lists the facts. A beat stopped for two beats is quick evidence but can be a starved thread, so while such
silences alone decide between several stopped ranks the watch goes on up to the loss bound. The first rank to
judge publishes the finding on the ``lost`` board (first writer wins), so every rank words it alike. Rank 0
hosts the store and may be a consequence too, so before it leaves, every live rank learns the finding without
reading the store in its failing main thread: rank 0's beat carries a ``|lost`` mark as soon as it holds a
finding, the other ranks' liveness threads (which read rank 0's beat every beat) then read and cache it, and
rank 0 stays up until every rank not proven gone (a silent one too) acknowledged it, or at most
:meth:`Liveness.hold` s. A rank whose store is gone and that has no cached finding judges rank 0 from its own
probes: gone (same host: its pid; else its port refuses connections) while its beat, read here shortly before,
carried neither the mark nor ``bye``, means it stopped first; "unknown" when this rank's watch had not read
that beat for long enough to miss the mark, or when a launcher that stops a failed worker's siblings
(torchrun) may have stopped it.

Its parts: the facts (:class:`ExitRecord`, :class:`RankFacts`) and the judgement over them (:func:`judge`,
its :class:`Finding`); then :class:`Liveness`, the watch itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

import torch.distributed as dist
from torch.distributed import Store

from distinit._board import Board, text
from distinit._duration import wait_bound
from distinit._foreign import first_line
from distinit._net import probe
from distinit.errors import RankLostError
from distinit.hang import DEFAULT_HANG_AFTER, HangSettings, HangWatch, Peers, beat_of, states_of, still_of
from distinit.init._policy import Pace, loss_bound, store_sign

logger = logging.getLogger("distinit.init")

#: The last beat of a rank whose watch stopped on purpose (teardown(), or its group destroyed).
BYE = "bye"
#: How long a rank other than 0 waits for rank 0's ``who`` as setup() returns.
WHO_WAIT = 5.0
#: A rank whose beat number is this many past the one its hang position carries publishes no position.
NOPOS = 3
#: With ``on_hang="abort"``, how often a rank reads the hang verdict between beats (seconds).
ABORT_POLL = 0.2
#: A store call that met a closed or refused connection: the store's server let go of it (its host is leaving).
STORE_CLOSED = re.compile(
    r"got 0 bytes|Connection was likely closed|Connection reset by peer|Broken pipe|Connection refused", re.IGNORECASE
)
#: How long a rank whose store closed its connection waits for rank 0's process (this host) to be gone (seconds).
EXIT_WAIT = 2.0
#: Appended to rank 0's beat once the ``lost`` board holds a finding: the other ranks read and cache it.
MARK = "|lost"

#: What a failed collective says when a peer went away (gloo's and NCCL's wordings; matched, never parsed).
PEER_CLOSED = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ncclRemoteError|remote process exited"
    r"|NCCL communicator was aborted",
    re.IGNORECASE,
)
#: A collective that timed out waiting for a peer: a consequence of a rank that stopped or hangs.
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting|timed out after|Watchdog caught collective operation timeout")


def peer_closed(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a collective that failed because a peer went away (gloo or NCCL)."""
    return isinstance(exc, RuntimeError) and PEER_CLOSED.search(str(exc)) is not None


def consequence(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception in its chain) is a failure caused by another rank, not by this one.

    A collective whose peer went away or that timed out waiting for one, and distinit's own ``RankLostError``
    (raised after such a collective names the lost rank, e.g. by the Lightning settings exchange).
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RankLostError) or peer_closed(exc):
            return True
        if isinstance(exc, RuntimeError) and COLLECTIVE_TIMEOUT.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def clock_text(wall: float | None) -> str:
    """``17:12:03.25 UTC`` (a rank's own clock), or ``unknown``."""
    if wall is None:
        return "unknown"
    return datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-4] + " UTC"


ExitKind = Literal["peer", "error"]
State = Literal["beating", "silent", "gone", "bye"]


@dataclass(frozen=True)
class ExitRecord:
    """Why a rank left, written by the rank itself at exit (``kind|wall|detail``)."""

    kind: ExitKind
    wall: float
    detail: str

    def encode(self) -> str:
        return f"{self.kind}|{self.wall:.3f}|{self.detail[:300]}"

    @classmethod
    def parse(cls, value: bytes | str) -> ExitRecord | None:
        """The record in a store value, or None when it is not one (never raises)."""
        kind, _, rest = text(value).partition("|")
        wall, _, detail = rest.partition("|")
        try:
            when = float(wall)
        except ValueError:
            return None
        if kind == "peer":
            return cls("peer", when, detail)
        if kind == "error":
            return cls("error", when, detail)
        return None


@dataclass(frozen=True)
class RankFacts:
    """One peer as this rank sees it: ``who`` (``rank 1 (host h, pid 9)``), its beat, its exit record."""

    rank: int
    who: str
    state: State
    last_wall: float | None  # its own clock at its last beat (None: never read)
    record: ExitRecord | None = None

    @property
    def stopped_at(self) -> float | None:
        """When it stopped, by its own clock: its exit record's time, else its last beat."""
        return self.record.wall if self.record is not None else self.last_wall

    def how(self) -> str:
        """How it ended, in words (never a guess beyond the facts)."""
        if self.record is not None and self.record.kind == "error":
            return f"it raised {self.record.detail}"
        if self.state == "gone":
            return "its process is gone (killed or crashed: it left no exit record)"
        if self.state == "bye":
            return "it left without an error (teardown() or a normal exit) while the others were in a collective"
        if self.state == "silent":
            return "no heartbeat since then and no exit record (killed, crashed, frozen or cut off)"
        return "it is still beating"

    def fact(self) -> str:
        if self.last_wall is None and self.record is not None:  # its last beat was its goodbye
            return f"{self.who}: {self.how()}; it left at {clock_text(self.record.wall)}"
        return f"{self.who}: {self.how()}; last heartbeat {clock_text(self.last_wall)}"


@dataclass(frozen=True)
class Finding:
    """The judgement: the culprit's rank (None: unknown) and the words every rank prints."""

    culprit: int | None
    text: str


def judge(facts: Sequence[RankFacts], *, margin: float) -> Finding:
    """Which rank stopped first, from ``facts`` about every peer (pure).

    A rank stopped when its beat stopped, it said bye, its pid is gone, or it left an error record; one whose
    record says a collective failed on a peer (``peer``) is a consequence, never the culprit. One such rank
    is the culprit; of several, the first only when it stopped more than ``margin`` s (a beat, plus clock
    skew) before the next; else "unknown" with the facts. Ranks still beating are never named.
    """
    consequences = [f for f in facts if f.record is not None and f.record.kind == "peer"]
    stopped = _stopped(facts)
    after = _after(consequences)
    if not stopped:
        return Finding(
            None,
            "unknown: no rank stopped beating or left a record of its own failure (a rank whose main thread hangs "
            f"still beats; see the other ranks' logs){after}",
        )
    order = sorted(stopped, key=lambda f: (f.stopped_at is None, f.stopped_at or 0.0, f.rank))
    first = order[0]
    if len(order) == 1:
        return Finding(first.rank, f"{first.fact()}{after}")
    second = order[1]
    if first.stopped_at is not None and second.stopped_at is not None and second.stopped_at - first.stopped_at > margin:
        later = "; ".join(f.fact() for f in order[1:])
        return Finding(first.rank, f"{first.fact()}. It stopped first; later: {later}{after}")
    return Finding(
        None,
        f"unknown: {len(order)} ranks stopped within {margin:.1f} s of each other, so which was first is not "
        f"known: {'; '.join(f.fact() for f in order)}{after}",
    )


#: What a finding starts with: a rank named as :meth:`RankFacts.fact` words it, or "unknown: ".
FINDING = re.compile(r"(rank \d+[ :]|unknown: )")
#: The longest finding read from the store (facts about every rank of a large world fit).
FINDING_MAX = 1 << 16


def is_finding(value: str) -> bool:
    """Whether ``value`` has the shape of a finding :func:`judge` words (pure): never junk shown as one."""
    return len(value) <= FINDING_MAX and FINDING.match(value) is not None and value.isprintable()


def unsettled(facts: Sequence[RankFacts]) -> bool:
    """Whether a beat that merely stopped would decide between several stopped ranks (pure).

    Two beats missed can be a thread starved on a loaded host, not a dead rank: such a rank could be named
    first, or make the verdict "unknown", while the dead rank is known. Its silence is worth watching longer,
    up to the loss bound. A rank gone from this host, said bye or left a record is a fact already.
    """
    stopped = _stopped(facts)
    return len(stopped) > 1 and any(f.state == "silent" and f.record is None for f in stopped)


def _stopped(facts: Sequence[RankFacts]) -> list[RankFacts]:
    """The ranks that stopped without being a consequence: not beating, or left an error record."""
    return [
        f
        for f in facts
        if not (f.record is not None and f.record.kind == "peer")
        and (f.state != "beating" or (f.record is not None and f.record.kind == "error"))
    ]


def _after(consequences: Sequence[RankFacts]) -> str:
    if not consequences:
        return ""
    ranks = ", ".join(str(f.rank) for f in sorted(consequences, key=lambda f: f.rank))
    return f"; consequences (left because a collective failed on a peer): rank {ranks}"


class Liveness:
    """After :func:`distinit.setup`: who every rank is (host, pid) and when it last beat, cheap to consult.

    One daemon thread per rank writes ``who/<rank>`` (``host|pid``) once and ``beat/<rank>`` every
    ``pace.beat`` s on the group's own store (keys under the default group's prefix, so a new group starts
    clean). Rank 0 reads every rank's beat in one ``multi_get`` per beat and the others read rank 0's, so
    the store serves about 2 operations per rank per beat; a watched rank silent for ``pace.stale`` s is
    logged at WARNING, naming its rank, host, pid and last beat, even while this rank is blocked in a
    collective that will never complete. When a collective fails because a peer went away, :meth:`lost` says
    which rank stopped first (see the module docstring).
    """

    def __init__(
        self,
        store: Store,
        *,
        rank: int,
        world_size: int,
        beat: float,
        stale: float,
        master: tuple[str, int] | None = None,
        torchrun: bool = False,
        hang: HangWatch | None = None,
    ) -> None:
        """A watch not yet started (see :meth:`started`).

        ``torchrun``: a torchrun agent started this rank (``DistEnv.launcher``); it stops every worker of a
        node when one fails, so a gone rank 0 may have been stopped for another worker.
        """
        self.store, self.rank, self.world_size = store, rank, world_size
        self._beat_every, self._stale = beat, stale
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.master = master
        self._siblings_stopped = torchrun
        self._who: dict[int, str] = {}  # rank -> "host|pid", as read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self.finding: str | None = None  # the published finding, once this rank has read it
        self.alive: set[int] = set()  # rank 0: the ranks not proven gone when it judged (they acknowledge)
        self._rank0: tuple[float, bytes] | None = None  # not rank 0: rank 0's beat as last read, and when
        self._failed_at: float | None = None  # when this rank's watch found the store gone
        self._junk_seen = False  # the 'lost' key held something no rank wrote (warned once)
        self._beat_lock = threading.Lock()
        self.hang = hang  # the live hang verdict (distinit.hang), sampled and judged once a beat
        self._left: set[int] = set()  # ranks whose last beat said bye (teardown())
        self._pos_seen: dict[int, tuple[int | None, float]] = {}  # judge: rank -> its position's beat, first seen
        self._judge_seen: dict[int, tuple[bytes, float]] = {}  # rank 1 judging: every rank's beat as seen
        self._hang_failed = False
        self._bye_read = False  # not rank 0: this rank's watch read rank 0's bye (and said so on the store)

    @property
    def _board(self) -> Board:
        """The ``lost`` key: who went away, published by the first rank that judged (built on use: no store kept)."""
        return Board(self.store, "lost", rank=self.rank, world_size=self.world_size)

    @property
    def window(self) -> float:
        """How long a peer's beat must stay unchanged before it counts as stopped: two beats and half a second."""
        return 2 * self._beat_every + 0.5

    @classmethod
    def started(
        cls,
        store: Store,
        *,
        rank: int,
        world_size: int,
        environ: Mapping[str, str],
        master: tuple[str, int] | None,
        torchrun: bool = False,
        hang: HangSettings | None = None,
        counts: Callable[[], dict[str, int]] | None = None,
        group_name: Callable[[object], str | None] | None = None,
    ) -> Liveness:
        """A started watch at the join's pace for ``world_size`` (and the loss bound ``environ`` sets).

        ``torchrun``: as :class:`Liveness` (the rank's ``DistEnv.launcher == "torchrun"``).

        With ``hang`` enabled, it also samples the calling thread's stack for the hang verdict (``counts``: the
        collectives issued per group).
        """
        pace = Pace.for_world(world_size, loss_bound=loss_bound(environ))
        watch = None
        if hang is not None and hang.enabled:
            watch = HangWatch(
                hang,
                rank=rank,
                counts=counts or dict,
                thread_id=threading.get_ident(),
                environ=environ,
                group_name=group_name,
            )
        liveness = cls(
            store,
            rank=rank,
            world_size=world_size,
            beat=pace.beat,
            stale=pace.stale,
            master=master,
            torchrun=torchrun,
            hang=watch,
        )
        liveness.introduce()
        liveness.start()
        return liveness

    def introduce(self, timeout: float = WHO_WAIT) -> None:
        """Write ``who/<rank>``; a rank other than 0 also reads rank 0's (waiting at most ``timeout`` s).

        Done before setup() returns (rank 0 writes its own at the same moment, the ranks having just passed
        the verifying collective together): a rank killed right after setup() returns is named with its host
        and pid, and rank 0 is named by host and pid even when its store dies with it.
        """
        try:
            self.store.set(f"who/{self.rank}", f"{self.host}|{self.pid}")
            if self.rank != 0:
                self.store.wait(["who/0"], timedelta(seconds=timeout))
                self._who[0] = text(self.store.get("who/0"))
                # rank 0 answered, and no collective has failed since setup(): it holds no finding now
                self._rank0 = (time.monotonic(), b"")
        except (RuntimeError, OSError) as exc:
            logger.debug("rank %d: rank 0's host and pid not read: %s", self.rank, exc)

    def start(self) -> None:
        """Start the thread (its first act writes who this rank is)."""
        self._thread = threading.Thread(target=self._run, name=f"distinit-liveness-rank{self.rank}", daemon=True)
        self._thread.start()

    def stop(self, see_off: float = 0.0) -> None:
        """Stop beating and watching (before the group and its store are destroyed).

        The thread's last act is a ``bye`` beat, so watchers know this rank left on purpose: a rank that
        finished and called ``teardown()`` is no "stopped" warning on a rank 0 that is still saving a
        checkpoint. Written by the thread, the join below bounds what a dead store can cost at exit.
        ``see_off`` (rank 0, seconds): keep the store up until the ranks still beating read that bye
        (:meth:`_see_off`).
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_bound(0.5))
        if see_off > 0 and self.rank == 0 and self.finding is None:
            with contextlib.suppress(RuntimeError, OSError, AttributeError):  # a dead store: nobody can read it
                self._see_off(see_off)
        self.store = None  # type: ignore[assignment]  # let go of the store (rank 0: its server)

    def _see_off(self, bound: float) -> None:
        """Rank 0 leaves through teardown(): keep its store up until every rank still beating read its ``bye``.

        A survivor whose store dies judges rank 0 by its beat as last read (:meth:`_store_gone`). Had it missed
        the ``bye``, a rank 0 that caught a collective's error and ended normally (``sys.exit``, a framework's
        ``except``) would look like the rank that stopped first. Each watch acknowledges the ``bye`` when it
        reads it, at its next beat; a rank that said ``bye`` itself or whose process is gone here is not waited
        for. At most ``bound`` s (:meth:`hold`): a survivor starved for longer says "unknown" instead.
        """
        own = f"beat/{self.rank}"  # checked first: a get of a key never written waits out the store's timeout
        if self.world_size < 2 or not self.store.check([own]) or self.store.get(own) != BYE.encode():
            return
        waiting = list(range(1, self.world_size))
        end, logged = time.monotonic() + bound, False
        while waiting:
            acked = set(self._present(waiting, "byeseen"))
            beating = [r for r in self._present(waiting, "beat") if r not in acked]
            beats = dict(zip(beating, self.store.multi_get([f"beat/{r}" for r in beating]), strict=True))
            for rank in beats:
                self.describe(rank)  # reads its who key once, for _process
            waiting = [r for r, beat in beats.items() if beat != BYE.encode() and self._process(r) != "gone"]
            if not waiting:
                return
            if not logged:
                logged = True
                logger.debug(
                    "rank 0: keeps the store up until %s read that it leaves (at most %.0f s)",
                    ", ".join(self.describe(r) for r in waiting),
                    bound,
                    extra={"distinit": {"event": "init.see_off", "rank": 0}},
                )
            if time.monotonic() >= end:
                logger.info(
                    "rank 0: leaves after %.0f s with %s not having read that it leaves (starved or frozen?)",
                    bound,
                    ", ".join(self.describe(r) for r in waiting),
                    extra={"distinit": {"event": "init.see_off_ended", "rank": 0, "waiting": waiting}},
                )
                return
            time.sleep(self._beat_every / 4)  # the watches acknowledge once a beat; each poll reads every rank

    def _run(self) -> None:
        try:
            seen: dict[int, tuple[bytes, float]] = {}
            warned: dict[int, float | None] = {}  # rank -> its last beat's wall clock when warned about
            while True:
                if self.rank != 0 and 0 not in self._who and self.store.check(["who/0"]):
                    self._who[0] = text(self.store.get("who/0"))
                if self.rank == 0 and self.finding is None:
                    self.finding = self._published()
                    self._announce()
                with self._beat_lock:  # no unmarked beat after _mark(): rank 0's mark stays up while it holds
                    self._seq += 1
                    mark = MARK if self.rank == 0 and self.finding is not None else ""
                    self.store.set(f"beat/{self.rank}", f"{self._seq}|{time.time():.3f}{mark}")
                watched = [r for r in (range(self.world_size) if self.rank == 0 else (0,)) if r != self.rank]
                silent_now = self._silent(watched, seen, self._stale)
                for silent in silent_now:
                    if silent.rank not in warned:
                        warned[silent.rank] = silent.last_wall
                        self._warn(silent)
                for rank in set(warned) - {s.rank for s in silent_now}:
                    self._back(rank, seen[rank][0] if rank in seen else None, warned.pop(rank))  # not seen: bye
                self._hang_tick(seen)
                if self._pause() or not dist.is_initialized():
                    # stopped, or the group was destroyed without teardown(): say so, then let go of its store
                    if self._stop.is_set():
                        # A verdict published while this rank could not read it is still its to log: a culprit
                        # that was SIGSTOPped, then continued, finishes its collective and calls teardown() within
                        # the beat it resumed in, so its next _hang_tick would never come.
                        self._hear()
                    self.store.set(f"beat/{self.rank}", BYE)
                    return
        except (RuntimeError, OSError, ValueError, AttributeError) as exc:
            # The store went away (or was let go of by stop()): nothing left to watch.
            if not self._stop.is_set():
                self._failed_at = time.monotonic()
                logger.debug("rank %d: liveness watch stopped: %s", self.rank, exc)
        finally:
            if not dist.is_initialized():
                self.store = None  # type: ignore[assignment]  # the group is gone: free its store (rank 0: the server)

    def _pause(self) -> bool:
        """Wait one beat (True: stopped); with ``on_hang="abort"``, read the verdict every :data:`ABORT_POLL` s.

        A verdict that stops the job must reach every rank well within its 2 s: the culprit waits for the others to
        have heard it before it leaves (its exit fails their collectives at once).
        """
        hang = self.hang
        if hang is None or hang.settings.on_hang != "abort":
            return self._stop.wait(self._beat_every)
        end = time.monotonic() + self._beat_every
        while (left := end - time.monotonic()) > 0:
            if self._stop.wait(min(ABORT_POLL, left)):
                return True
            self._hear()
        return False

    def _hang_tick(self, seen: dict[int, tuple[bytes, float]]) -> None:
        """The hang verdict's part of a beat: publish where this rank is; judge (rank 0); read the verdict."""
        hang = self.hang
        if hang is None:
            return
        with self._hang_guard():
            position = hang.position(self._seq)
            if position is not None:
                self.store.set(f"pos/{self.rank}", position)
            if self.rank == 0 or (self.rank == 1 and 0 in seen and time.monotonic() - seen[0][1] >= self._stale):
                self._judge_hang(hang, seen)
        self._hear()

    def _hear(self) -> None:
        """Read the verdict key and act on a new verdict (a forged or broken record is never acted on)."""
        hang = self.hang
        if hang is None:
            return
        with self._hang_guard():
            if self.store.check(["hang"]):
                hang.heard(self.store.get("hang"), peers=self._peers())

    @contextlib.contextmanager
    def _hang_guard(self) -> Iterator[None]:
        """Store failures go to the watch's own handling; any other fault in the hang verdict turns it off.

        A defect, or input it did not foresee: one WARNING, and the liveness watch goes on.
        """
        try:
            yield
        except (RuntimeError, OSError):
            raise
        except Exception as exc:
            self.hang = None
            logger.warning(
                "rank %d: the hang verdict is off for the rest of this run: %s: %s",
                self.rank,
                type(exc).__name__,
                exc,
                exc_info=True,
                extra={"distinit": {"event": "hang.failed", "rank": self.rank}},
            )

    def _judge_hang(self, hang: HangWatch, seen: dict[int, tuple[bytes, float]]) -> None:
        """Read every rank's position (one round trip), judge, and publish a new verdict under ``hang``.

        How long a rank has been silent: its beat as this watch saw it (rank 0 watches every rank's; rank 1,
        judging while rank 0 is silent, reads them all too), else how long its position has not moved. A rank
        whose beat number is :data:`NOPOS` or more past the beat its position carries publishes no position
        ("nopos": its hang verdict is off or failed), so nothing is known of where it is and it is never named.
        (A rank that just resumed has beaten once since its last position: that is not "nopos".)
        """
        ranks = list(range(self.world_size))
        present = self._present(ranks, "pos")
        values = self.store.multi_get([f"pos/{r}" for r in present]) if present else []
        positions: dict[int, bytes | None] = dict(zip(present, values, strict=True))
        now = time.monotonic()
        for rank, value in positions.items():
            number = beat_of(value) if value is not None else None
            if rank not in self._pos_seen or self._pos_seen[rank][0] != number:
                self._pos_seen[rank] = (number, now)
        floor = hang.settings.hang_after or DEFAULT_HANG_AFTER  # the threshold is never below it
        if max(map(still_of, values), default=0.0) < floor:
            hang.clear()
            return  # no rank has stayed put that long: no verdict possible (parsed only when one has)
        if self.rank != 0:  # judging for a silent rank 0: read every rank's beat, as rank 0 does
            self._silent([r for r in ranks if r != self.rank], self._judge_seen, math.inf)
            seen = self._judge_seen
        silent, process = silence(
            [r for r in ranks if r != self.rank], beats=seen, positions=self._pos_seen, left=self._left, now=now
        )
        states = states_of(positions, ranks=ranks, silent_for=silent, process=lambda r: process.get(r, ""))
        if not hang.needs_detail(states, silent_after=self._stale):
            return
        states = states_of(
            positions,
            ranks=ranks,
            silent_for=silent,
            who=self.describe,
            process=lambda r: process.get(r) or self._process(r),
        )
        record = hang.consider(states, silent_after=self._stale)
        if record is not None:
            self.store.set("hang", record)

    def _process(self, rank: int) -> str:
        """What this host's kernel says of ``rank``'s process: left, stopped, disk, running, gone; "" (another host)."""
        if rank in self._left:
            return "left"
        where, _, pid = self._who.get(rank, "").partition("|")
        if where != self.host or not (pid.isascii() and pid.isdigit()):
            return ""
        state = _proc_state(int(pid))
        if state in (None, "Z", "X"):
            return "gone"
        return {"T": "stopped", "t": "stopped", "D": "disk"}.get(state, "running")

    def _peers(self) -> Peers:
        """What the hang verdict's abort learns of the others: who is gone here, and who heard the verdict."""
        store = self.store

        def acked(ranks: Sequence[int]) -> bool:
            with contextlib.suppress(RuntimeError, OSError):
                return not ranks or store.check([f"hang/ack/{r}" for r in ranks])
            return False

        def ack() -> None:
            with contextlib.suppress(RuntimeError, OSError):
                store.set(f"hang/ack/{self.rank}", "1")

        return Peers(
            world_size=self.world_size, hosts_store=self.rank == 0, gone=self._culprit_gone, ack=ack, acked=acked
        )

    def _culprit_gone(self, rank: int) -> bool | None:
        """Whether ``rank``'s process is gone (None: not on this host, unknown)."""
        if rank not in self._who:
            self.describe(rank)  # reads (and keeps) its who key
        who = self._who.get(rank)
        if who is None or who.partition("|")[0] != self.host:
            return None
        return _gone_here(who, self.host)

    def _learn(self) -> None:
        """Rank 0's beat carries the mark: read the finding once, keep it, and acknowledge it."""
        if self.finding is None:
            self.finding = self._published()
            if self.finding is not None:
                self._board.acknowledge()
                self._announce()

    def _announce(self) -> None:
        """The watch thread learnt the finding: say it now, while this rank may still wait in a collective.

        A rank whose collective fails only when another survivor exits (or never, under NCCL until its timeout)
        is told at once; its own exit repeats the same words.
        """
        if self.finding is not None and threading.current_thread() is self._thread:
            logger.warning(
                "rank %d: (its liveness watch, while this rank may still wait in a collective) a peer went away: %s",
                self.rank,
                self.finding,
                extra={"distinit": {"event": "init.peer_named", "rank": self.rank}},
            )

    def _silent(self, ranks: list[int], seen: dict[int, tuple[bytes, float]], stale: float) -> list[_Silent]:
        """The ``ranks`` whose beat has not changed for ``stale`` s as seen here (``seen`` is updated)."""
        present = [r for r in ranks if r in seen]
        if len(present) < len(ranks):
            present = self._present(ranks, "beat")
        if not present:
            return []
        values = self.store.multi_get([f"beat/{r}" for r in present])
        now, out = time.monotonic(), []
        for rank, value in zip(present, values, strict=True):
            if rank == 0 and self.rank != 0:
                self._rank0 = (now, value)
                if value.endswith(MARK.encode()):
                    self._learn()
                elif value == BYE.encode() and not self._bye_read:
                    self._bye_read = True
                    self.store.set(f"byeseen/{self.rank}", "1")  # rank 0 may now take its store away (_see_off)
            if value == BYE.encode():  # left on purpose (teardown): never silent
                seen.pop(rank, None)
                self._left.add(rank)
                continue
            before = seen.get(rank)
            if before is None or before[0] != value:
                seen[rank] = (value, now)
            elif now - before[1] >= stale:
                out.append(_Silent(rank, now - before[1], _wall(value)))
        return out

    def _present(self, ranks: list[int], name: str) -> list[int]:
        """The ``ranks`` whose ``<name>/<rank>`` key exists: one round trip when all do, else one per rank."""
        if not ranks or self.store.check([f"{name}/{r}" for r in ranks]):
            return ranks
        return [r for r in ranks if self.store.check([f"{name}/{r}"])]

    def _published(self) -> str | None:
        """The finding on the ``lost`` board, or None (none yet, or something no rank of ours wrote)."""
        return self._checked(self._board.read())

    def _checked(self, value: str | None) -> str | None:
        """``value`` if it is a finding as :func:`judge` words them, else None, warned about once.

        Any client of the store can write the ``lost`` key; what is not a finding is never printed as one (each
        rank then judges and words for itself).
        """
        if value is None or is_finding(value):
            return value
        if not self._junk_seen:
            self._junk_seen = True
            logger.warning(
                "rank %d: the store's 'lost' key holds %d characters that are no finding of distinit's (%r...): "
                "ignored; another client of the store wrote it",
                self.rank,
                len(value),
                value[:40],
                extra={"distinit": {"event": "init.board_junk", "rank": self.rank}},
            )
        return None

    def describe(self, rank: int) -> str:
        """``rank 1 (host gpu-b, pid 902)``, from ``who/<rank>`` (read once), or just ``rank 1``."""
        who = self._who.get(rank)
        if who is None:
            with contextlib.suppress(RuntimeError, OSError, AttributeError):
                if self.store.check([f"who/{rank}"]):
                    who = self._who[rank] = text(self.store.get(f"who/{rank}"))
        if who is None:
            return f"rank {rank}"
        host, _, pid = who.partition("|")
        if not _plausible_who(host, pid):
            return f"rank {rank} (its who key holds no host|pid: {who[:40]!r})"
        return f"rank {rank} (host {host}, pid {pid})"

    def _warn(self, silent: _Silent) -> None:
        logger.warning(
            "rank %d: %s has not beaten for %.1f s (last seen %s): it died, is frozen or starved (SIGSTOP, a C call "
            "holding the GIL, swap) or lost the network; a collective with it waits until it beats again or fails",
            self.rank,
            self.describe(silent.rank),
            silent.silent_for,
            clock_text(silent.last_wall),
            extra={"distinit": {"event": "init.peer_lost", "rank": self.rank, "lost_rank": silent.rank}},
        )

    def _back(self, rank: int, beat: bytes | None, last_wall: float | None) -> None:
        """A rank warned about beats again (``beat``) or said bye (None): it was alive, so the warning is withdrawn."""
        now = _wall(beat) if beat is not None else None
        gap = f" after {now - last_wall:.1f} s" if now is not None and last_wall is not None else ""
        how = f"beats again{gap}" if beat is not None else "left through teardown()"
        logger.warning(
            "rank %d: %s %s: it was alive (frozen or starved, not lost); the warning above is withdrawn",
            self.rank,
            self.describe(rank),
            how,
            extra={"distinit": {"event": "init.peer_back", "rank": self.rank, "back_rank": rank}},
        )

    def record_exit(self, kind: ExitKind, detail: str) -> None:
        """Write this rank's exit record (before its last beat): why it leaves. A dead store is ignored."""
        with contextlib.suppress(RuntimeError, OSError, AttributeError):
            self.store.set(f"exit/{self.rank}", ExitRecord(kind, time.time(), detail).encode())

    def lost(self, bound: float) -> str:
        """Which rank stopped first, in words, the same on every rank; within ``bound`` s (module docstring)."""
        if self.finding is not None:
            return self.finding
        try:
            published = self._published()
            if published is None:
                published = self._judge(time.monotonic() + bound)
            self.finding = published
            self._mark()
            return published
        except (RuntimeError, OSError, AttributeError) as exc:  # AttributeError: the store was let go of
            if self.finding is not None:  # learnt by the thread meanwhile
                return self.finding
            return self._store_gone(self.hold(bound), exc)
        finally:
            with contextlib.suppress(RuntimeError, OSError, AttributeError):
                self._board.acknowledge()

    def _judge(self, end: float) -> str:
        """Watch every peer for :attr:`window` s (or until a finding is published), judge, publish.

        A peer whose beat stopped for two beats counts as stopped, which is quick but can be a starved thread
        on a loaded host. So while that alone decides between several stopped ranks (:func:`unsettled`),
        the watch goes on up to the loss bound (``stale``) since it began: a peer that beats again is alive.
        """
        peers = [r for r in range(self.world_size) if r != self.rank]
        present = self._present(peers, "who")
        values = self.store.multi_get([f"who/{r}" for r in present]) if present else []
        self._who.update((r, text(value)) for r, value in zip(present, values, strict=True))
        seen: dict[int, tuple[bytes, float]] = {}
        self._silent(peers, seen, math.inf)  # the beats as they are now
        began = time.monotonic()
        quiet_end, firm_end = min(end, began + self.window), min(end, began + self._stale)
        while time.monotonic() < quiet_end:
            published = self._published()
            if published is not None:
                return published
            time.sleep(min(0.1, self._beat_every))
        facts = self._facts(peers, seen)
        while unsettled(facts) and time.monotonic() < firm_end:
            published = self._published()
            if published is not None:
                return published
            time.sleep(min(0.25, self._beat_every))
            facts = self._facts(peers, seen)
        finding = judge(facts, margin=self._beat_every + 0.5)
        # The ranks rank 0 waits for before it takes the store away: every peer not proven gone but the culprit.
        self.alive = {f.rank for f in facts if f.state in ("beating", "silent") and f.rank != finding.culprit}
        self.alive.add(self.rank)
        published = self._board.publish(finding.text)
        if self._checked(published) is None:  # junk from another store client: ours takes its place
            published = self._board.replace(published, finding.text)
        return self._checked(published) or finding.text

    def _facts(self, peers: list[int], seen: dict[int, tuple[bytes, float]]) -> list[RankFacts]:
        """Every peer as the store and this host show it now (``seen``: the beats as first seen, updated)."""
        silent = {s.rank: s for s in self._silent(peers, seen, 2 * self._beat_every)}
        beating = self._present(peers, "beat")
        beats = dict(zip(beating, self.store.multi_get([f"beat/{r}" for r in beating]), strict=True))
        with_records = self._present(peers, "exit")
        records = self.store.multi_get([f"exit/{r}" for r in with_records]) if with_records else []
        exits = {r: ExitRecord.parse(v) for r, v in zip(with_records, records, strict=True)}
        facts = []
        for rank in peers:
            beat = beats.get(rank)
            state: State = "beating"
            if beat == BYE.encode():
                state = "bye"
            elif rank in silent:
                # its pid gone from this host decides, but only with its beat stopped: the who key is a claim
                # any store client can overwrite, the beat is what the rank itself does
                state = "gone" if rank in self._who and _gone_here(self._who[rank], self.host) else "silent"
            last = silent[rank].last_wall if rank in silent else (_wall(beat) if beat is not None else None)
            if last is None and rank in seen:
                last = _wall(seen[rank][0])
            facts.append(RankFacts(rank, self.describe(rank), state, last, exits.get(rank)))
        return facts

    def hold(self, bound: float) -> float:
        """How long rank 0 keeps the store up for the ranks that have not read the finding (seconds).

        ``bound`` plus three seconds, at least four beats: a watch that reads rank 0's beat once a beat cannot miss
        the mark, and a survivor whose store died within this long of seeing rank 0 without one knows that rank 0
        did not leave as a consequence.
        """
        return max(bound + 3.0, 4 * self._beat_every)

    def _mark(self) -> None:
        """Rank 0 holds a finding: mark its beat now (its thread keeps the mark), so every watch learns it.

        Under the beat lock, so the thread cannot write an unmarked beat after it (a store call that hangs holds
        the lock at most a second here: then the mark is written anyway).
        """
        if self.rank != 0:
            return
        locked = self._beat_lock.acquire(timeout=1.0)
        try:
            with contextlib.suppress(RuntimeError, OSError, AttributeError):
                self.store.set(f"beat/{self.rank}", f"{self._seq}|{time.time():.3f}{MARK}")
        finally:
            if locked:
                self._beat_lock.release()

    def _missed_for(self) -> float | None:
        """Seconds between this rank last seeing rank 0 without a finding and the store failing (None: never)."""
        if self._rank0 is None:
            return None
        failed = self._failed_at if self._failed_at is not None else time.monotonic()
        return max(0.0, failed - self._rank0[0])

    def _store_gone(self, hold: float, failure: BaseException | None = None) -> str:
        """This rank's store calls fail and it holds no finding: is rank 0, the store host, gone, and first?

        Rank 0 marks its beat as soon as it holds a finding and keeps the store up ``hold`` s for the ranks
        that have not read it, and a leaving rank 0 writes ``bye``. So rank 0 gone with neither read here is
        evidence that it stopped first only if this rank last saw rank 0 without a finding (its beat read by
        the watch, or rank 0 answering as setup() returned) less than ``hold`` (and a margin) before the store
        failed: else the mark may have come and gone unseen.

        ``failure``: what the store call raised (:meth:`_exited_here`).
        """
        who = self.describe(0)
        host_pid = self._who.get(0)
        if host_pid is not None and host_pid.partition("|")[0] == self.host:
            gone, evidence = self._exited_here(host_pid, failure)
        else:
            gone, evidence = self._port_refuses()
        if not gone:
            return (
                f"unknown: {who} hosts the store, and the store stopped answering: {evidence}; no rank's finding "
                "reached this rank"
            )
        if self._siblings_stopped:
            return (
                f"unknown: {who}, the store host, is gone ({evidence}) and left no finding; under torchrun its agent "
                "stops every worker of its node when one fails, so rank 0 may have been stopped for another worker "
                "(the agent's log names the first to fail)"
            )
        if self._rank0 is not None and self._rank0[1] == BYE.encode():
            return (
                f"unknown: {who}, the store host, left through teardown() (its last beat said bye) without a finding, "
                "so which rank stopped first is not known here; see rank 0's log"
            )
        if self._rank0 is not None and self._rank0[1].endswith(MARK.encode()):
            return (
                f"unknown: {who}, the store host, is gone ({evidence}); its beat said it held a finding, which this "
                "rank could not read (see rank 0's log), so rank 0 did not stop first"
            )
        missed = self._missed_for()
        if missed is None or missed > hold - 0.5:
            seen = "never" if missed is None else f"{missed:.1f} s before the store failed"
            return (
                f"unknown: {who}, the store host, is gone ({evidence}); this rank last saw it without a finding "
                f"{seen}, long enough for a finding rank 0 held for {hold:.0f} s to go unseen (a starved or frozen "
                "watch here), so rank 0 may have left as a consequence; see the other ranks' logs"
            )
        return (
            f"{who}: the store host is gone ({evidence}) and left no finding or exit record (seen without either "
            f"{missed:.1f} s before the store failed): it stopped first"
        )

    def _exited_here(self, host_pid: str, failure: BaseException | None) -> tuple[bool, str]:
        """Is rank 0's process (``host|pid`` on this host) gone, and in what words?

        A store that closed or refused the connection (``failure``) while the process still runs is a rank 0 on
        its way out: its exit is waited for, at most :data:`EXIT_WAIT` s.
        """
        closed = failure is not None and STORE_CLOSED.search(str(failure)) is not None
        gone = _gone_here(host_pid, self.host)
        end = time.monotonic() + (EXIT_WAIT if closed else 0.0)
        while not gone and time.monotonic() < end:
            time.sleep(0.05)
            gone = _gone_here(host_pid, self.host)
        if gone:
            return True, "its process is gone"
        if closed:
            return False, (
                f"its process was still running {EXIT_WAIT:.0f} s after the store closed this rank's connection "
                f"({first_line(failure or 'no detail')})"
            )
        return False, "its process is still running (frozen or busy?)"

    def _port_refuses(self) -> tuple[bool, str]:
        """Probe MASTER_ADDR:MASTER_PORT a few times (at most ~1.5 s): does nothing serve it any more?"""
        if self.master is None:
            return False, "MASTER_ADDR/MASTER_PORT unknown here, so it was not probed"
        addr, port = self.master
        signs = []
        for _ in range(3):
            result = probe(addr, port, 0.5, handshake_timeout=0.5)
            signs.append((store_sign(result.kind, result.detail), result.detail))
            if signs[-1][0] != "absent":
                break
            time.sleep(0.1)
        sign, detail = signs[-1]
        if sign == "absent":
            return True, f"its port {addr}:{port} refuses connections: {detail}"
        return False, f"a probe of {addr}:{port} says {sign}: {detail}"

    def linger(self, bound: float) -> None:
        """Rank 0 (the store host): stay up until the ranks not proven gone read the finding, or :meth:`hold` s."""
        board, waited = self._board, sorted(self.alive)
        with contextlib.suppress(RuntimeError, OSError, AttributeError):
            unread = [r for r in waited if not board.acknowledged([r])] if waited else ["every rank"]
            if unread:
                logger.info(
                    "rank 0: keeps the store up until %s read the finding (at most %.0f s)",
                    ", ".join(r if isinstance(r, str) else self.describe(r) for r in unread),
                    self.hold(bound),
                    extra={"distinit": {"event": "init.linger", "rank": 0}},
                )
        # By rank, not by count: a consequence that acknowledged and left counts in ``seen`` too, and must not
        # stand in for a rank still blocked in its collective (which then found the store gone).
        board.linger(
            bound=self.hold(bound), settled=lambda seen: bool(waited) and board.acknowledged(waited), quiet=0.0
        )


class _Silent:
    def __init__(self, rank: int, silent_for: float, last_wall: float | None) -> None:
        self.rank, self.silent_for, self.last_wall = rank, silent_for, last_wall


def _wall(beat: bytes) -> float | None:
    """The wall clock of a ``seq|wall[|lost]`` beat value, if it is one."""
    parts = beat.decode(errors="replace").split("|")
    try:
        return float(parts[1]) if len(parts) > 1 else None
    except ValueError:
        return None


def _plausible_who(host: str, pid: str) -> bool:
    """``host|pid`` as a rank writes it: a printable host name (no spaces) and a decimal pid."""
    return 0 < len(host) <= 255 and host.isprintable() and " " not in host and pid.isascii() and pid.isdigit()


def silence(
    ranks: Sequence[int],
    *,
    beats: Mapping[int, tuple[bytes, float]],
    positions: Mapping[int, tuple[int | None, float]],
    left: Collection[int],
    now: float,
) -> tuple[dict[int, float], dict[int, str]]:
    """How long each rank has been silent as the hang judge sees it, and what is known of its process.

    ``beats``: each rank's beat value and when this watch first saw it; ``positions``: the beat number each
    rank's position carries and when it was first seen. Silent for: since its beat last changed, else since
    its position last changed. A rank that left is silent forever ("left"); one that beat :data:`NOPOS` times
    since the beat its position carries publishes no position ("nopos"). A position that carries a *newer*
    beat than the one read for it was written between the judge's two reads (beats, then positions): the rank
    beat just now, so it is not silent. (Reading that rank's old beat as its last sign of life once gave a
    rank that had held the GIL for 15 s and had just entered the collective "silent since", and the verdict
    flipped from naming it to "none is missing" for the one rank that read it then.)
    """
    silent: dict[int, float] = {}
    process: dict[int, str] = {}
    for rank in ranks:
        beat = now - beats[rank][1] if rank in beats else None
        stale = now - positions[rank][1] if rank in positions else None
        published = positions[rank][0] if rank in positions else None
        number = _beat_number(beats[rank][0]) if rank in beats else None
        if rank in left:
            silent[rank], process[rank] = math.inf, "left"
        elif number is not None and published is not None and published > number:
            silent[rank] = stale or 0.0  # its position is newer than the beat read before it: alive just now
        elif beat is not None and number is not None and published is not None and number - published >= NOPOS:
            process[rank] = "nopos"  # it beat NOPOS times since its last position: it publishes none
        else:
            silent[rank] = beat if beat is not None else (stale or 0.0)
    return silent, process


def _beat_number(beat: bytes) -> int | None:
    """The sequence number of a ``seq|wall[|lost]`` beat value, if it is one."""
    head = beat.split(b"|", 1)[0]
    return int(head) if head.isdigit() and len(head) <= 18 else None


def _proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (R, S, D, T, t, Z, X...), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        return "?"  # there, but not readable here
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3].decode(errors="replace") or "?"


def _gone_here(who: str, host: str) -> bool:
    """``host|pid`` names a process of this host that no longer exists (a zombie is gone: it runs no more)."""
    where, _, pid = who.partition("|")
    if where != host or not (pid.isascii() and pid.isdigit()):
        return False
    return _proc_state(int(pid)) in (None, "Z", "X")
