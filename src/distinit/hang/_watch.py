"""The hang verdict at run time: settings, the judge's memory, and what every rank does with a verdict.

:class:`HangWatch` is driven by :func:`distinit.setup`'s liveness thread, once a beat:

* every rank publishes :meth:`HangWatch.position` (``pos/<rank>`` on the group's store);
* the judge (rank 0; rank 1 while rank 0's beat is silent) hands every rank's state to :meth:`HangWatch.consider`,
  which runs :func:`~._verdict.judge` and returns a record to publish under ``hang`` only when the verdict is
  new (the same hang is published once);
* every rank reads ``hang`` and hands it to :meth:`HangWatch.heard`: one WARNING (the same text on every rank),
  one JSON line in ``DISTINIT_VERDICT_FILE`` when set, the culprit's full stack in the culprit's own log, and,
  with ``on_hang="abort"``, the exit: the culprit at once, the others once the culprit is gone (same host) or
  about a second after the verdict, so that torchrun's Root Cause is the culprit. Every rank exits with
  :data:`HANG_EXIT_CODE`.

A record on the store is bounded and checked before use: any client of the store can write the key, and what is
not a verdict of ours is never printed or acted on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, TypeGuard

from distinit._duration import to_seconds
from distinit.errors import MalformedEnvError
from distinit.hang._position import Position, Sampler, json_object
from distinit.hang._verdict import HangVerdict, RankState, judge, threshold

logger = logging.getLogger("distinit.hang")

#: The exit code of every rank that ``on_hang="abort"`` stops (sysexits' EX_TEMPFAIL: a restart may succeed).
HANG_EXIT_CODE = 75
#: ``DISTINIT_HANG_AFTER``: seconds a rank waits in a collective before the verdict, or ``off``.
HANG_AFTER_VARIABLE = "DISTINIT_HANG_AFTER"
#: ``DISTINIT_VERDICT_FILE``: a file that receives every verdict as one JSON line.
VERDICT_FILE_VARIABLE = "DISTINIT_VERDICT_FILE"
#: The largest verdict record read from the store (bytes).
MAX_RECORD = 16384
#: At most this many culprits are listed in a record (the text names them all, in ranges).
MAX_NAMED = 64
#: After a verdict that stops the job: how long the culprit waits for the others to hear it, and they for it to leave.
CULPRIT_FIRST = 1.0
#: How long the others stay after the culprit is gone: a launcher that polls its workers sees the culprit fail alone.
LAUNCHER_GRACE = 0.5
#: The longest flushing the logs may take before a leaving rank exits anyway (seconds).
EXIT_BACKSTOP = 0.5

#: What setup(on_hang=...) accepts: "report" (log the verdict, keep waiting) or "abort" (also stop every rank).
OnHang = Literal["report", "abort"]


@dataclass(frozen=True)
class HangSettings:
    """What ``setup(hang_after=..., on_hang=..., hang_verdict=...)`` and ``DISTINIT_HANG_AFTER`` decided."""

    enabled: bool = True
    hang_after: float | None = None  # None: DEFAULT_HANG_AFTER, or twice the median gap between collectives
    on_hang: OnHang = "report"

    @classmethod
    def of(
        cls,
        *,
        hang_after: float | timedelta | None,
        on_hang: str,
        hang_verdict: bool,
        environ: Mapping[str, str],
    ) -> HangSettings:
        """Validated settings: the arguments first, then ``DISTINIT_HANG_AFTER`` (seconds, or ``off``).

        Raises:
            ValueError: ``on_hang`` is not ``"report"`` or ``"abort"``, or ``hang_after`` is not positive.
            TypeError: ``hang_after`` is not a number of seconds.
            MalformedEnvError: ``DISTINIT_HANG_AFTER`` is neither positive seconds nor ``off``.
        """
        if on_hang not in ("report", "abort"):
            raise ValueError(f"on_hang must be 'report' or 'abort', got {on_hang!r}")
        if not isinstance(hang_verdict, bool):
            raise TypeError(f"hang_verdict must be True or False, got {hang_verdict!r}")
        after = None if hang_after is None else to_seconds(hang_after, "hang_after")
        enabled = hang_verdict
        raw = environ.get(HANG_AFTER_VARIABLE, "").strip()
        if raw and after is None:
            if raw.lower() == "off":
                enabled = False
            else:
                value = float(raw) if raw.isascii() and raw.replace(".", "", 1).isdigit() else math.nan
                if not (math.isfinite(value) and value > 0):
                    raise MalformedEnvError(
                        f"{HANG_AFTER_VARIABLE}={raw!r} is neither a positive number of seconds nor 'off'.",
                        variables=(HANG_AFTER_VARIABLE,),
                        fix=f"export {HANG_AFTER_VARIABLE}=30 (how long ranks may wait in one collective before the "
                        "hang verdict), or off to turn the verdict off.",
                    )
                after = value
        return cls(enabled=enabled, hang_after=after, on_hang="abort" if on_hang == "abort" else "report")


class HangWatch:
    """One rank's part of the hang verdict (see the module docstring)."""

    def __init__(
        self,
        settings: HangSettings,
        *,
        rank: int,
        counts: Callable[[], dict[str, int]],
        thread_id: int | None = None,
        environ: Mapping[str, str] | None = None,
        exit: Callable[[int], object] = os._exit,
        group_name: Callable[[object], str | None] | None = None,
    ) -> None:
        self.settings, self.rank = settings, rank
        self._sampler = Sampler(counts, thread_id=thread_id, group_name=group_name or (lambda group: None))
        self._thread_id = thread_id if thread_id is not None else threading.main_thread().ident
        self._published: str | None = None  # the judge: the key of the verdict it published for the hang now
        self._count = 0  # the judge: verdicts published
        self._heard: str | None = None  # the last verdict's key this rank acted on
        env = os.environ if environ is None else environ
        self._file = env.get(VERDICT_FILE_VARIABLE) or None
        self._exit = exit
        self.last: HangVerdict | None = None
        self._leaving = threading.RLock()  # the liveness thread and the main thread's failure may both leave
        self._left = False
        self._culprits: list[int] = []
        self._peers = Peers()
        self._hold_until = 0.0

    def position(self, beat: int = 0) -> str | None:
        """This rank's position at beat number ``beat``, encoded for ``pos/<rank>`` (None: the thread is gone)."""
        position = self._sampler.sample(beat)
        return None if position is None else position.encode()

    def consider(self, states: Sequence[RankState], *, silent_after: float) -> str | None:
        """The judge: a record to publish when the states make a verdict not published before, else None."""
        limit = threshold(self.settings.hang_after, (s.position for s in states))
        verdict = judge(states, threshold=limit, silent_after=silent_after)
        if verdict is None:
            self._published = None  # the hang is over: the same one again later is a new verdict
            return None
        if verdict.key == self._published:
            return None
        self._published = verdict.key
        self._count += 1
        self.last = verdict
        record = json.dumps(
            {
                # read as new by every rank, even for a hang seen before; the judge's rank: rank 1 judges too
                "key": f"{self.rank}.{self._count}:{verdict.key}",
                "kind": verdict.kind,
                "text": verdict.text,
                "waiting": len(verdict.waiting),  # a count: the text names them, and 10k ranks would not fit
                "culprits": list(verdict.culprits[:MAX_NAMED]),
                "judge": self.rank,
                "threshold": limit,
                "time": time.time(),
            }
        )
        if parse_record(record) is None:  # never publish what no rank would read (say so instead)
            logger.warning(
                "rank %d: a hang verdict could not be published (%d bytes): %s",
                self.rank,
                len(record),
                verdict.text[:2000],
                extra={"distinit": {"event": "hang.unpublished", "rank": self.rank}},
            )
            return None
        return record

    def clear(self) -> None:
        """The judge found no hang possible this beat: a later hang, even the same one, is a new verdict."""
        self._published = None

    def needs_detail(self, states: Sequence[RankState], *, silent_after: float) -> bool:
        """Whether a verdict is due (cheap: the judge fills in hosts and processes only then); clears when none is."""
        limit = threshold(self.settings.hang_after, (s.position for s in states))
        verdict = judge(states, threshold=limit, silent_after=silent_after)
        if verdict is None:
            self._published = None
        return verdict is not None and verdict.key != self._published

    def heard(self, value: bytes | str, *, peers: Peers | None = None) -> None:
        """A record read from ``hang``: act on it once (log, file, the culprit's stack, the abort)."""
        record = parse_record(value)
        if record is None or record.key == self._heard:
            return
        self._heard = record.key
        culprits = list(record.culprits)
        role = "culprit" if self.rank in culprits else "victim" if culprits else None
        logger.warning(
            "rank %d: %s",
            self.rank,
            record.text,
            extra={"distinit": {"event": "hang.verdict", "rank": self.rank, "culprits": culprits}},
        )
        if role == "culprit":
            logger.warning(
                "rank %d: this rank is named the likely culprit; its main thread's stack:\n%s",
                self.rank,
                self.stack(),
                extra={"distinit": {"event": "hang.culprit_stack", "rank": self.rank}},
            )
        self._write(record, role)
        stops = record.kind in ("culprit", "mismatch")
        if self.settings.on_hang == "abort" and stops:
            self._abort(record, culprits, peers or Peers())

    def stack(self) -> str:
        """The sampled thread's full Python stack, as ``traceback`` prints it."""
        frame = sys._current_frames().get(self._thread_id) if self._thread_id is not None else None
        if frame is None:
            return "  (the thread is gone)"
        return "".join(traceback.format_stack(frame))

    def _write(self, record: Record, role: str | None) -> None:
        if self._file is None:
            return
        line = {
            "event": "hang.verdict",
            "time": time.time(),
            "rank": self.rank,
            "pid": os.getpid(),
            "role": role,
            "culprits": list(record.culprits),
            "waiting": record.waiting,
            "kind": record.kind,
            "detail": record.text,
            "published": record.time,
        }
        try:
            fd = os.open(self._file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            logger.warning("rank %d: %s=%s could not be written: %s", self.rank, VERDICT_FILE_VARIABLE, self._file, exc)

    def _abort(self, record: Record, culprits: list[int], peers: Peers) -> None:
        """``on_hang="abort"``: every rank leaves with :data:`HANG_EXIT_CODE` and the verdict as its reason.

        The culprit leaves first, so that a launcher that reports the first failure it sees (torchrun's Root
        Cause; its agent polls every ``--monitor-interval`` s) names it. But not before the others have heard the
        verdict (at most :data:`CULPRIT_FIRST` s): its exit fails their collectives at once. From the moment a rank
        heard it, an exception in any of its threads (that failure) ends it the same way, with the same reason,
        instead of a traceback and exit code 1. The others leave :data:`LAUNCHER_GRACE` s after the culprit is seen
        gone (on this host), or :data:`CULPRIT_FIRST` plus that much after they heard it: meanwhile torchrun's
        agent, having seen the culprit fail, stops them itself.
        """
        reason = f"on_hang='abort': exiting with code {HANG_EXIT_CODE}: {record.text}"
        self._culprits, self._peers = culprits, peers
        self._hold_until = time.monotonic() + CULPRIT_FIRST + LAUNCHER_GRACE
        sys.excepthook = lambda kind, exc, tb: self._leave(reason, f"{kind.__name__}: {exc}")
        threading.excepthook = lambda args: self._leave(reason, f"{args.exc_type.__name__}: {args.exc_value}")
        peers.ack()
        if self.rank in culprits:
            end = time.monotonic() + CULPRIT_FIRST
            others = [r for r in range(peers.world_size) if r not in culprits]
            while time.monotonic() < end and not peers.acked(others):
                time.sleep(0.02)
        self._leave(reason, None)

    def _leave(self, reason: str, failed: str | None) -> None:
        """Log the reason once (whichever thread comes first), let the culprit go first, flush, and exit."""
        with self._leaving:
            if not self._left:
                self._left = True
                after = f" (its own collective failed meanwhile: {failed.splitlines()[0][:200]})" if failed else ""
                logger.error(
                    "rank %d: %s%s",
                    self.rank,
                    reason,
                    after,
                    extra={"distinit": {"event": "hang.abort", "rank": self.rank}},
                )
            if self.rank not in self._culprits:
                gone_at: float | None = None
                others = [r for r in range(self._peers.world_size) if r != self.rank]
                while (now := time.monotonic()) < self._hold_until:
                    if gone_at is None and all(self._peers.gone(r) for r in self._culprits):
                        gone_at = now
                    heard = not self._peers.hosts_store or self._peers.acked(others)  # the store host goes last
                    if gone_at is not None and now - gone_at >= LAUNCHER_GRACE and heard:
                        break
                    time.sleep(0.02)
            # whatever flushing does (a blocked pipe, a handler's lock held by the main thread), the exit comes
            backstop = threading.Timer(EXIT_BACKSTOP, self._exit, (HANG_EXIT_CODE,))
            backstop.daemon = True
            backstop.start()
            for handler in [*logging.getLogger().handlers, *logging.getLogger("distinit").handlers, *logger.handlers]:
                with contextlib.suppress(Exception):  # a broken handler must not keep a hung job alive
                    handler.flush()
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            self._exit(HANG_EXIT_CODE)


@dataclass(frozen=True)
class Peers:
    """What a rank can learn of the others while it acts on a verdict (the liveness watch provides it).

    The defaults know nothing: nobody is seen gone, acknowledgements are not exchanged.
    """

    world_size: int = 0
    hosts_store: bool = False  # this rank hosts the store: it leaves last (after every rank heard the verdict)
    gone: Callable[[int], bool | None] = lambda rank: None
    ack: Callable[[], None] = lambda: None
    acked: Callable[[Sequence[int]], bool] = lambda ranks: False


@dataclass(frozen=True)
class Record:
    """A verdict as published under ``hang`` and read back by every rank."""

    key: str
    kind: str
    text: str
    waiting: int  # how many ranks wait (the text names them)
    culprits: tuple[int, ...]
    time: float


def parse_record(value: bytes | str) -> Record | None:
    """A verdict record as :meth:`HangWatch.consider` writes it, or None (too long, junk, or not ours)."""
    record = json_object(value, MAX_RECORD)
    if record is None:
        return None
    text, key, kind, when = record.get("text"), record.get("key"), record.get("kind"), record.get("time")
    waiting, culprits = record.get("waiting"), record.get("culprits")
    if not (isinstance(text, str) and text.startswith("hang: ") and text.isprintable()):
        return None
    if not isinstance(key, str) or kind not in ("culprit", "mismatch", "stuck", "unknown"):
        return None
    if not (type(waiting) is int and waiting >= 0 and _ranks(culprits) and isinstance(kind, str)):
        return None
    if not (isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when)):
        return None
    return Record(key, kind, text, waiting, tuple(culprits), float(when))


def _ranks(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and len(value) <= MAX_NAMED and all(type(r) is int and r >= 0 for r in value)


def states_of(
    positions: Mapping[int, bytes | None],
    *,
    ranks: Sequence[int],
    silent_for: Mapping[int, float],
    who: Callable[[int], str] | None = None,
    process: Callable[[int], str] | None = None,
) -> list[RankState]:
    """One :class:`RankState` per rank from what the store and the beats say (``who``/``process``: the details)."""
    out = []
    for rank in ranks:
        value = positions.get(rank)
        position = Position.parse(value) if value is not None else None
        out.append(
            RankState(
                rank,
                who(rank) if who is not None else f"rank {rank}",
                position,
                silent_for=silent_for.get(rank, 0.0),
                process=process(rank) if process is not None else "",
            )
        )
    return out
