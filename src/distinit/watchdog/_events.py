"""Structured watchdog events: one frozen model, logged on ``distinit.watchdog`` and written as JSONL."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger("distinit.watchdog")

EventName = Literal[
    "watchdog.started",
    "watchdog.stopped",
    "watchdog.registered",
    "watchdog.adopted",
    "watchdog.rejected",
    "watchdog.expired",
    "watchdog.exited_armed",
]
Outcome = Literal["killed", "exited", "unkillable"]


class WatchdogEvent(BaseModel):
    """One thing the watchdog server saw or did. ``model_dump_json()`` is one line of the events file.

    For ``watchdog.expired``: ``scope``/``thread`` name the region, ``deadline`` is on CLOCK_MONOTONIC,
    ``overshoot_s`` is how late the server noticed, ``dead_after_s`` how long after the deadline the worker
    was seen dead, ``signals`` lists what was sent in order, and ``outcome`` says how it ended.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: EventName
    time: float = Field(default_factory=time.time, description="wall-clock time (epoch seconds)")
    server_pid: int = Field(default_factory=os.getpid)
    path: str = ""
    pid: int | None = None
    start_time: int | None = None
    uid: int | None = None
    scope: str | None = None
    thread: int | None = None
    after_s: float | None = None
    deadline: float | None = None
    overshoot_s: float | None = None
    dead_after_s: float | None = None
    stack_file: str | None = None
    stack: str | None = None
    signals: tuple[str, ...] = ()
    outcome: Outcome | None = None
    detail: str = ""


_LEVELS: dict[str, int] = {
    "watchdog.started": logging.INFO,
    "watchdog.stopped": logging.INFO,
    "watchdog.registered": logging.DEBUG,
    "watchdog.adopted": logging.INFO,
    "watchdog.rejected": logging.WARNING,
    "watchdog.expired": logging.ERROR,
    "watchdog.exited_armed": logging.INFO,
}


def describe(ev: WatchdogEvent) -> str:
    """A one-line human summary of an event (the log message)."""
    who = f"pid {ev.pid}" if ev.pid is not None else "server"
    if ev.event == "watchdog.expired":
        stack = f"; stack in {ev.stack_file}" if ev.stack else "; no stack captured"
        return (
            f"watchdog: {who} overran scope {ev.scope!r} (armed for {ev.after_s or 0:.3f} s, noticed "
            f"{ev.overshoot_s or 0:.3f} s late); sent {', '.join(ev.signals) or 'nothing'}; "
            f"outcome {ev.outcome} {ev.dead_after_s or 0:.3f} s after the deadline{stack}. "
            f"{ev.detail}".rstrip()
        )
    if ev.event == "watchdog.exited_armed":
        return f"watchdog: {who} exited while armed in scope {ev.scope!r}; forgotten (not killed). {ev.detail}"
    return f"watchdog: {ev.event.split('.', 1)[1]} {who} on {ev.path}. {ev.detail}".rstrip()


class EventSink:
    """Logs every event and appends it to an optional JSONL file (thread-safe, one line per event)."""

    def __init__(self, events_path: str | None) -> None:
        """Open ``events_path`` for appending (created 0600), or only log when None."""
        self._lock = threading.Lock()
        self._fh = None
        if events_path is not None:
            fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._fh = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def emit(self, ev: WatchdogEvent) -> None:
        """Log ``ev`` and write it to the events file."""
        payload = ev.model_dump(exclude={"stack"})
        logger.log(_LEVELS[ev.event], "%s", describe(ev), extra={"distinit": payload})
        if self._fh is not None:
            with self._lock:
                self._fh.write(ev.model_dump_json() + "\n")

    def close(self) -> None:
        """Close the events file."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
