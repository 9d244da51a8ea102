"""Enforcement: find each worker's earliest expired region and run the kill ladder for it in a thread."""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections.abc import Callable

from distinit.watchdog._events import WatchdogEvent, region_event
from distinit.watchdog._ladder import LadderConfig, LadderResult, run_ladder
from distinit.watchdog._slots import TableReader
from distinit.watchdog._worker import Worker

logger = logging.getLogger("distinit.watchdog")


def first_expired(table: TableReader, now: float) -> tuple[int | None, float]:
    """(the slot with the earliest deadline <= ``now`` or None, the nearest deadline still ahead)."""
    expired: tuple[int, float] | None = None
    nearest = math.inf
    for slot, dl in table.armed():
        if dl <= now:
            if expired is None or dl < expired[1]:
                expired = (slot, dl)
        elif dl < nearest:
            nearest = dl
    # Re-read the slot: a region that disarmed (and maybe re-armed) since the scan is not expired.
    if expired is not None and table.deadline(expired[0]) != expired[1]:
        expired = None
    return (None if expired is None else expired[0]), nearest


class Enforcer:
    """Starts one ladder thread per expired worker and hands the results back to the server thread."""

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
        self._done: queue.SimpleQueue[tuple[tuple[int, int], LadderResult]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def check(self, workers: list[Worker], now: float, on_damaged: Callable[[Worker, Exception], None]) -> float:
        """Start a ladder for every worker with an expired region; the nearest deadline still ahead."""
        nearest = math.inf
        for w in workers:
            if w.busy or w.unkillable or w.exited:
                continue
            try:
                if w.table.closed:
                    continue
                slot, ahead = first_expired(w.table, now)
            except (OSError, ValueError) as exc:  # the table was truncated or replaced under us
                on_damaged(w, exc)
                continue
            nearest = min(nearest, ahead)
            if slot is not None:
                self._start(w, slot, now)
        return nearest

    def _start(self, w: Worker, slot: int, detected: float) -> None:
        w.busy = True
        t = threading.Thread(
            target=self._run, args=(w, slot, detected), name=f"distinit-watchdog-kill-{w.ref.pid}", daemon=True
        )
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def finished(self) -> list[tuple[tuple[int, int], LadderResult]]:
        """The (worker key, result) of every ladder that ended since the last call."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for each running ladder."""
        for t in self._threads:
            t.join(timeout)

    def _run(self, w: Worker, slot: int, detected: float) -> None:
        try:
            info = w.table.slot_info(slot)
        except (OSError, ValueError):
            info = (detected, detected, "?", 0)
        stack_path = w.stack_path if os.path.exists(w.stack_path) else None
        try:
            result = run_ladder(w.ref, _dump_signal(w), stack_path, self.ladder)
        except Exception as exc:  # never leave the worker marked busy (and unwatched) forever
            logger.exception(
                "watchdog: the kill ladder for pid %d failed",
                w.ref.pid,
                extra={"distinit": {"event": "watchdog.ladder_failed", "pid": w.ref.pid}},
            )
            result = LadderResult(
                outcome="unkillable" if w.ref.alive() else "exited", detail=f"the kill ladder failed: {exc!r}"
            )
        ev = expired_event(self.path, w, info, detected=detected, stack_path=stack_path, result=result)
        self._emit(ev)
        if self._on_expire is not None:
            try:
                self._on_expire(ev)
            except Exception:
                logger.exception(
                    "watchdog: on_expire callback raised for pid %d",
                    w.ref.pid,
                    extra={"distinit": {"event": "watchdog.callback_failed", "pid": w.ref.pid}},
                )
        self._done.put((w.key, result))
        self._wake()


def _dump_signal(w: Worker) -> int:
    try:
        return w.table.dump_signal
    except (OSError, ValueError):
        return 0


def expired_event(
    path: str,
    w: Worker,
    info: tuple[float, float, str, int],
    *,
    detected: float,
    stack_path: str | None,
    result: LadderResult,
) -> WatchdogEvent:
    """The ``watchdog.expired`` event for one ladder run on region ``info`` (deadline, armed_at, scope, thread)."""
    return region_event(
        "watchdog.expired",
        path=path,
        pid=w.ref.pid,
        start_time=w.ref.start,
        uid=w.uid,
        region=info,
        overshoot_s=round(detected - info[0], 6),
        dead_after_s=None if result.dead_at is None else round(result.dead_at - info[0], 6),
        stack_file=stack_path if result.stack else None,
        stack=result.stack,
        signals=tuple(result.signals),
        outcome=result.outcome,
        detail=result.detail,
    )
