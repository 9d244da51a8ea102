"""Structured watchdog events: one frozen model, logged on ``distinit.watchdog`` and written as JSONL."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from distinit.errors import WatchdogError

logger = logging.getLogger("distinit.watchdog")

EventName = Literal[
    "watchdog.started",
    "watchdog.stopped",
    "watchdog.registered",
    "watchdog.adopted",
    "watchdog.rejected",
    "watchdog.expired",
    "watchdog.verdict",
    "watchdog.exited_armed",
    "watchdog.fifo_replaced",
]
#: ``refused``: the FileTimer drop-in did not signal the pid (reused, protected, or not this user's process).
Outcome = Literal["killed", "exited", "unkillable", "released", "refused"]
#: In a group of workers that expired together: the one(s) running their own code, or those waiting on them.
Role = Literal["culprit", "victim"]


class WatchdogEvent(BaseModel):
    """One thing the watchdog server saw or did. ``model_dump_json()`` is one line of the events file.

    For ``watchdog.expired``: ``scope``/``thread`` name the region, ``deadline`` is on CLOCK_MONOTONIC,
    ``overshoot_s`` is how late the server noticed, ``dead_after_s`` how long after the deadline the worker
    was seen dead, ``signals`` lists what was sent in order, and ``outcome`` says how it ended
    (``released``: a victim that left its region during the hold, not killed). ``rank``, ``local_rank`` and
    ``world_size`` are what the worker's launcher told it (None: unknown). When several workers expired
    together, ``role`` says whether this one was judged the ``culprit`` or a ``victim``, and
    ``watchdog.verdict`` (``rank`` = the likely culprit's) says what was decided and why, in ``detail``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: EventName
    time: float = Field(default_factory=time.time, description="wall-clock time (epoch seconds)")
    server_pid: int = Field(default_factory=os.getpid)
    path: str = ""
    pid: int | None = None
    start_time: int | None = None
    uid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    role: Role | None = None
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


# Its public home: reprs and pickles never name a private module. Set after the class is built, because
# pydantic resolves the field annotations (EventName, Outcome) in the module named by __module__.
WatchdogEvent.__module__ = "distinit.watchdog"


def region_event(
    event: EventName,
    *,
    path: str,
    region: tuple[float, float, str, int],
    **facts: Any,
) -> WatchdogEvent:
    """An event about one armed region, ``region`` being (deadline, armed_at, scope, thread).

    ``facts`` add to it: who the worker is (``Worker.facts()``: pid, start time, uid, ranks) and the rest.
    """
    deadline, armed_at, scope, thread = region
    return WatchdogEvent(
        event=event,
        path=path,
        scope=scope,
        thread=thread,
        after_s=round(deadline - armed_at, 6),
        deadline=deadline,
        **facts,
    )


_LEVELS: dict[str, int] = {
    "watchdog.started": logging.INFO,
    "watchdog.stopped": logging.INFO,
    "watchdog.registered": logging.DEBUG,
    "watchdog.adopted": logging.INFO,
    "watchdog.rejected": logging.WARNING,
    "watchdog.expired": logging.ERROR,
    "watchdog.verdict": logging.ERROR,
    "watchdog.exited_armed": logging.INFO,
    "watchdog.fifo_replaced": logging.WARNING,
}


def describe(ev: WatchdogEvent) -> str:
    """A one-line human summary of an event (the log message)."""
    who = f"pid {ev.pid}" if ev.pid is not None else "server"
    if ev.rank is not None and ev.pid is not None:
        who = f"RANK {ev.rank} (pid {ev.pid})"
    if ev.event == "watchdog.verdict":
        return ev.detail
    if ev.event == "watchdog.expired":
        stack = "; no stack captured" if not ev.stack else f"; stack in {ev.stack_file or 'the event'}"
        armed = "" if ev.after_s is None else f"armed for {ev.after_s:.3f} s, "
        dead = "" if ev.dead_after_s is None else f" {ev.dead_after_s:.3f} s after the deadline"
        return (
            f"watchdog: {who} overran scope {ev.scope!r} ({armed}noticed {ev.overshoot_s or 0:.3f} s late); "
            f"sent {', '.join(ev.signals) or 'nothing'}; outcome {ev.outcome}{dead}{stack}. {ev.detail}".rstrip()
        )
    if ev.event == "watchdog.exited_armed":
        return f"watchdog: {who} exited while armed in scope {ev.scope!r}; forgotten (not killed). {ev.detail}"
    return f"watchdog: {ev.event.split('.', 1)[1]} {who} on {ev.path}. {ev.detail}".rstrip()


def open_events_file(path: str) -> int:
    """Open ``path`` for appending events; a file descriptor of a regular file this user alone may write.

    The file is created 0600. An existing file is appended to only if it is a regular file of this user
    that nobody else may write: the events name every stack file and pid, and forged lines would mislead.
    Opened without following a symlink and without blocking, so a link to another file or a FIFO planted
    under the name is refused instead of written through or waited on.

    Raises:
        WatchdogError: the file cannot be opened, or is not one the server may write events to.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise WatchdogError(
            f"cannot open the events file {path!r}: {exc.strerror or exc}",
            why="a symlink (ELOOP) or a FIFO with no reader (ENXIO) stands under that name, or it is not writable",
            fix="pass --events a path in a directory only you can write, e.g. beside the watchdog directory",
        ) from exc
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this process's uid {os.geteuid()}"
    elif st.st_mode & 0o022:
        problem = f"has mode {st.st_mode & 0o777:o}: other users may write (forge) events"
    if problem is not None:
        os.close(fd)
        raise WatchdogError(
            f"refusing the events file {path!r}: it {problem}",
            why="someone else created or opened up this file: it could read every event or forge lines",
            fix="remove it, or pass --events a new path in a directory only you can write",
        )
    os.set_blocking(fd, True)
    return fd


class EventSink:
    """Logs every event and appends it to an optional JSONL file (thread-safe, one line per event)."""

    def __init__(self, events_path: str | None) -> None:
        """Open ``events_path`` for appending (see :func:`open_events_file`), or only log when None.

        Raises:
            WatchdogError: the events file is refused.
        """
        self._lock = threading.Lock()
        self._fh = None
        if events_path is not None:
            self._fh = os.fdopen(open_events_file(events_path), "a", encoding="utf-8", buffering=1)

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
