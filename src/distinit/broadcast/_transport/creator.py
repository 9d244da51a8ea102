"""Who made a ``distinit-bc-*`` name: the creating process's pid and start time, so a dead creator is provable.

A pid alone is reused; pid plus the start time from ``/proc/<pid>/stat`` (clock ticks since boot) names one
process for the life of the host. The broadcast transports put this tag into every name they make (the
shm transport's memfd, the file transport's temporary file), and ``distinit doctor``'s ``shm`` check removes
a ``distinit-bc-*`` entry only when its tag names a process that is gone.
"""

from __future__ import annotations

import os
import re

PREFIX = "distinit-bc-"
_TAG = re.compile(r"-p(\d+)s(\d+)(?:[-.]|$)")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # the name (field 2) may hold spaces and parentheses
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def tag(pid: int | None = None) -> str:
    """``p<pid>s<start time>`` of this process (or ``pid``)."""
    pid = os.getpid() if pid is None else pid
    return f"p{pid}s{start_time(pid) or 0}"


def creator(name: str) -> tuple[int, int] | None:
    """The (pid, start time) a ``distinit-bc-*`` name carries, or None for a name without a tag."""
    match = _TAG.search(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def gone(pid: int, start: int) -> bool:
    """Whether the process ``pid`` started at ``start`` has exited (its pid is free or now another process's)."""
    return start_time(pid) != start
