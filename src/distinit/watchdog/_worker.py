"""One watched worker: a verified process handle and its slot table, opened and released by the server."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import stat
from dataclasses import dataclass, field

from distinit.watchdog import _proc, _slots
from distinit.watchdog._protocol import Identity


@dataclass
class Worker:
    """One verified worker process and its slot table."""

    ref: _proc.ProcessRef
    table: _slots.TableReader
    uid: int
    stack_path: str
    sock: socket.socket | None = None
    busy: bool = False  # a kill ladder is running
    unkillable: bool = False
    exited: bool = False
    gone: bool = False  # its kill ladder ended it: no longer watched, though the server loop has yet to forget it
    identity: Identity = field(default_factory=Identity)  # from its hello; unknown for an adopted table
    mismatch: str = ""  # how the claimed ranks contradict /proc/<pid>/environ ("" when they do not)
    key: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (self.ref.pid, self.ref.start)

    def facts(self) -> dict[str, int | None]:
        """Who this worker is, as every event about it says: pid, start time, uid and its ranks."""
        ident = self.identity
        return {
            "pid": self.ref.pid,
            "start_time": self.ref.start,
            "uid": self.uid,
            "rank": ident.rank,
            "local_rank": ident.local_rank,
            "world_size": ident.world_size,
        }


def open_worker(directory: str, pid: int, start: int, uid: int, *, use_pidfd: bool, adopting: bool) -> Worker | str:
    """Verify process ``pid`` (started at ``start``) and open its table; the worker, or why not.

    ``adopting`` is True for a table found by the directory scan rather than announced over the socket: the
    process must then have the table mapped, proof that it created the table itself (a file alone, planted
    by anyone who can write the directory, never makes the server kill a process).
    """
    if _proc.owner_uid(pid) != uid:
        return f"pid {pid} is not owned by uid {uid}"
    ref = _proc.ProcessRef.open(pid, start, use_pidfd=use_pidfd)
    if ref is None:
        return f"pid {pid} (start time {start}) is gone, protected, or not a process leader"
    table_path = os.path.join(directory, _slots.slot_file_name(pid, start))
    try:
        table = _slots.TableReader(table_path, uid)
    except (OSError, ValueError) as exc:
        ref.close()
        return f"no valid slot table for pid {pid}: {exc}"
    problem = None
    if table.pid != pid or table.start != start:
        problem = f"slot table {table_path!r} names pid {table.pid}/{table.start}, the kernel says {pid}/{start}"
    elif adopting and not _proc.maps_file(pid, table.dev, table.ino):
        problem = (
            f"pid {pid} has not mapped {table_path!r}: it never created a watchdog client "
            "(a table planted by someone else)"
        )
    if problem is not None:
        table.close()
        ref.close()
        return problem
    return Worker(ref=ref, table=table, uid=uid, stack_path=os.path.join(directory, _slots.stack_file_name(pid, start)))


def release(w: Worker, *, unlink: bool) -> None:
    """Close the worker's handles; with ``unlink``, remove its table (if still this one) and empty stack file."""
    w.ref.close()
    w.table.close()
    if not unlink:
        return
    with contextlib.suppress(OSError):
        st = os.lstat(w.table.path)
        if (st.st_dev, st.st_ino) == (w.table.dev, w.table.ino):  # not a table re-created since
            os.unlink(w.table.path)
    with contextlib.suppress(OSError):
        st = os.lstat(w.stack_path)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(w.stack_path)


def first_expired(table: _slots.TableReader, now: float) -> tuple[int | None, float]:
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


def region_info(w: Worker, slot: int, detected: float) -> tuple[float, float, str, int]:
    """(deadline, armed_at, scope, thread) of ``w``'s ``slot``; placeholders when the table is unreadable."""
    try:
        return w.table.slot_info(slot)
    except (OSError, ValueError):
        return (detected, detected, "?", 0)


def dump_signal(w: Worker) -> int:
    """The signal ``w``'s faulthandler listens on (0: none, or its table is unreadable)."""
    try:
        return w.table.dump_signal
    except (OSError, ValueError):
        return 0


def stack_file(w: Worker) -> str | None:
    """``w``'s stack file when it exists (a client that never installed its dump handler has none)."""
    return w.stack_path if os.path.exists(w.stack_path) else None
