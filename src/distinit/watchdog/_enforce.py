"""Enforcement: find each worker's earliest expired region and run the kill ladder for it in a thread.

Workers of one job that expire together are handed to :mod:`~distinit.watchdog._batch` instead, which judges
the culprit and kills it first; a lone expiry goes straight to its ladder.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
from collections.abc import Callable

from distinit.watchdog._batch import gather, run_batch
from distinit.watchdog._events import Role, WatchdogEvent, region_event
from distinit.watchdog._ladder import LadderConfig, LadderResult, run_ladder
from distinit.watchdog._worker import Worker, dump_signal, first_expired, region_info, stack_file

logger = logging.getLogger("distinit.watchdog")


#: One member of a batch to enforce: the worker, its expired slot (None: not yet expired), its deadline.
Due = tuple[Worker, "int | None", float]


class Enforcer:
    """Starts one ladder thread per expired worker (or batch) and hands the results back to the server thread."""

    def __init__(
        self,
        *,
        path: str,
        ladder: LadderConfig,
        emit: Callable[[WatchdogEvent], None],
        on_expire: Callable[[WatchdogEvent], None] | None,
        wake: Callable[[], None],
    ) -> None:
        """Events go to ``emit`` (and ``on_expire``); ``wake`` nudges the server thread when a ladder ends."""
        self.path = path
        self.ladder = ladder
        self._emit = emit
        self._on_expire = on_expire
        self._wake = wake
        # (worker key, result); None: the worker was not killed (it left its region), keep watching it.
        self._done: queue.SimpleQueue[tuple[tuple[int, int], LadderResult | None]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def check(self, workers: list[Worker], now: float, on_damaged: Callable[[Worker, Exception], None]) -> float:
        """Start enforcing every worker with an expired region; the nearest deadline still ahead."""
        nearest = math.inf
        due: list[Due] = []
        ahead: list[Due] = []
        for w in workers:
            if w.busy or w.unkillable or w.exited:
                continue
            try:
                if w.table.closed:
                    continue
                slot, next_deadline = first_expired(w.table, now)
            except (OSError, ValueError) as exc:  # the table was truncated or replaced under us
                on_damaged(w, exc)
                continue
            nearest = min(nearest, next_deadline)
            if slot is not None:
                due.append((w, slot, now))
            else:
                ahead.append((w, None, next_deadline))
        window = self.ladder.group_window
        for batch in (
            gather(due, ahead, now + window, world=lambda m: m[0].identity.world_size, deadline=lambda m: m[2])
            if window > 0
            else [[m] for m in due]
        ):
            self._start(batch, now)
        return nearest

    def _start(self, batch: list[Due], detected: float) -> None:
        for w, _, _ in batch:
            w.busy = True
        w, slot, _ = batch[0]
        if len(batch) == 1 and slot is not None:
            target: Callable[[], None] = functools.partial(self._run, w, slot, detected)
        else:
            target = functools.partial(run_batch, self, batch, detected)
        self._spawn(target, f"distinit-watchdog-kill-{w.ref.pid}")

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()
        return t

    def finished(self) -> list[tuple[tuple[int, int], LadderResult | None]]:
        """The (worker key, result) of every ladder that ended since the last call (None: not killed)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for each running ladder."""
        for t in list(self._threads):
            t.join(timeout)

    def release(self, w: Worker) -> None:
        """``w`` was not killed (its region ended): the server watches it again."""
        self._done.put((w.key, None))
        self._wake()

    def _run(self, w: Worker, slot: int, detected: float) -> None:
        self.finish(w, region_info(w, slot, detected), detected=detected)

    def finish(
        self,
        w: Worker,
        info: tuple[float, float, str, int],
        *,
        detected: float,
        dumped: LadderResult | None = None,
        role: Role | None = None,
        note: str = "",
        slot: int | None = None,
    ) -> None:
        """Run the ladder for ``w`` (after its ``dumped`` stack, if taken), report it, hand the result back.

        With ``slot``, the worker is killed only if that slot still holds the deadline in ``info``: one that
        left its region meanwhile (a victim its culprit's death unblocked) is reported ``released``.
        """
        stack_path = stack_file(w)
        if slot is not None and not _still_armed(w, slot, info[0]):
            result = dumped or LadderResult(outcome="exited")
            result.outcome, result.detail = "released", "it left its region before it was killed (not killed)"
        else:
            result = self._ladder(w, stack_path, dumped)
        result.detail = " ".join(part for part in (note, result.detail, _dump_note(result)) if part)
        ev = expired_event(self.path, w, info, detected=detected, stack_path=stack_path, result=result, role=role)
        # Gone from worker_pids() before anyone hears of the expiry: the loop forgets the worker only later (it
        # owns the selector), and an on_expire callback or a reader of the events file would see it watched.
        w.gone = result.outcome not in ("released", "unkillable")
        self.report(ev)
        self._done.put((w.key, None if result.outcome == "released" else result))
        self._wake()

    def _ladder(self, w: Worker, stack_path: str | None, dumped: LadderResult | None) -> LadderResult:
        try:
            return run_ladder(w.ref, dump_signal(w), stack_path, self.ladder, dumped=dumped)
        except Exception as exc:  # never leave the worker marked busy (and unwatched) forever
            logger.exception(
                "watchdog: the kill ladder for pid %d failed",
                w.ref.pid,
                extra={"distinit": {"event": "watchdog.ladder_failed", "pid": w.ref.pid}},
            )
            return LadderResult(
                outcome="unkillable" if w.ref.alive() else "exited", detail=f"the kill ladder failed: {exc!r}"
            )

    def report(self, ev: WatchdogEvent) -> None:
        """Emit ``ev``; pass an expired event to ``on_expire`` too (whose errors are logged, never raised)."""
        self._emit(ev)
        # on_expire has always meant "after each expiry": a verdict is in the log and the events file.
        if self._on_expire is not None and ev.event == "watchdog.expired":
            try:
                self._on_expire(ev)
            except Exception:
                logger.exception(
                    "watchdog: on_expire callback raised for pid %s",
                    ev.pid,
                    extra={"distinit": {"event": "watchdog.callback_failed", "pid": ev.pid}},
                )


def expired_event(
    path: str,
    w: Worker,
    info: tuple[float, float, str, int],
    *,
    detected: float,
    stack_path: str | None,
    result: LadderResult,
    role: Role | None = None,
) -> WatchdogEvent:
    """The ``watchdog.expired`` event for one ladder run on region ``info`` (deadline, armed_at, scope, thread)."""
    return region_event(
        "watchdog.expired",
        path=path,
        region=info,
        **w.facts(),
        role=role,
        overshoot_s=round(detected - info[0], 6),
        dead_after_s=None if result.dead_at is None else round(result.dead_at - info[0], 6),
        stack_file=stack_path if result.stack else None,
        stack=result.stack,
        signals=tuple(result.signals),
        outcome=result.outcome,
        detail=result.detail,
    )


def _dump_note(result: LadderResult) -> str:
    """What the event says of a stack dump that was wanted but not read whole, and why ("" when it was)."""
    if not result.no_stack:
        return ""
    return f"Stack dump incomplete: {result.no_stack}." if result.stack else f"No stack dump: {result.no_stack}."


def _still_armed(w: Worker, slot: int, deadline: float) -> bool:
    try:
        return w.table.deadline(slot) == deadline
    except (OSError, ValueError):
        return False
