"""The directory scan: slot tables of live processes not watched yet; files of processes that are gone."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Container

from distinit.watchdog import _proc, _slots

#: How often the server looks for tables it does not watch yet.
SCAN_INTERVAL = 0.5


def unwatched_tables(
    directory: str, *, uid: int, watched: Container[tuple[int, int]]
) -> list[tuple[int, int, tuple[int, int]]]:
    """``(pid, start, (dev, inode))`` of each table in ``directory`` whose process lives and is not watched.

    Tables (and empty stack files) of processes that are gone are removed on the way, when ``uid`` owns
    them. Names that are not ``<pid>.<start>.slots`` in ASCII digits are ignored.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        parsed = _slots.parse_file_name(name)
        if parsed is None or parsed in watched:
            continue
        pid, start = parsed
        try:
            st = os.lstat(os.path.join(directory, name))
        except OSError:
            continue
        if _proc.start_time(pid) != start or _proc.state(pid) == "Z":
            remove_files_of(directory, pid, start, uid=uid)
            continue
        found.append((pid, start, (st.st_dev, st.st_ino)))
    return found


def remove_files_of(directory: str, pid: int, start: int, *, uid: int) -> None:
    """Remove the table and the empty stack file of a process that is gone (only files ``uid`` owns)."""
    table = os.path.join(directory, _slots.slot_file_name(pid, start))
    stack = os.path.join(directory, _slots.stack_file_name(pid, start))
    with contextlib.suppress(OSError):
        if os.lstat(table).st_uid == uid:
            os.unlink(table)
    with contextlib.suppress(OSError):
        st = os.lstat(stack)
        if st.st_uid == uid and stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(stack)
