"""The per-client slot table: a small shared-memory file that clients write and the server reads.

Layout (native byte order, every field 8 bytes and 8-byte aligned so each store is one machine store)::

    header   16 words   magic, version, pid, start_time, nslots, high-water mark, dump signal,
                        arms counter, closed flag, scope count, reserved...
    slots    NSLOTS x 4 words   deadline (f64, CLOCK_MONOTONIC s; 0 = free), armed_at (f64),
                                scope id (u64), thread ident (u64)
    scopes   NSCOPES x SCOPE_BYTES   1-byte length + UTF-8 name

Arming writes the scope id, thread and arm time, then the deadline last; disarming writes 0.0 to the deadline.
Those are plain memory stores into an mmap: no system call, nothing that can block or fail. The file outlives
the server, so a restarted server resumes every armed deadline.
"""

from __future__ import annotations

import mmap
import os
import stat

MAGIC = int.from_bytes(b"DWDGSLT1", "little")
VERSION = 1
HEADER_WORDS = 16
NSLOTS = 1024
SLOT_WORDS = 4
NSCOPES = 512
SCOPE_BYTES = 96
SLOTS_OFFSET = HEADER_WORDS * 8
SCOPES_OFFSET = SLOTS_OFFSET + NSLOTS * SLOT_WORDS * 8
FILE_SIZE = SCOPES_OFFSET + NSCOPES * SCOPE_BYTES

# Header word indices.
H_MAGIC, H_VERSION, H_PID, H_START, H_NSLOTS, H_HWM, H_DUMPSIG, H_ARMS, H_CLOSED, H_NSCOPES = range(10)
# Offsets inside one slot.
S_DEADLINE, S_ARMED_AT, S_SCOPE, S_THREAD = range(4)
OVERFLOW_SCOPE = "<scope table full>"


def slot_file_name(pid: int, start: int) -> str:
    """The slot file name for one process: ``<pid>.<start time>.slots``."""
    return f"{pid}.{start}.slots"


def stack_file_name(pid: int, start: int) -> str:
    """The stack-dump file name for one process: ``<pid>.<start time>.stack``."""
    return f"{pid}.{start}.stack"


def parse_file_name(name: str) -> tuple[int, int] | None:
    """(pid, start) from a slot file name, None if the name is not one."""
    parts = name.split(".")
    if len(parts) != 3 or parts[2] != "slots" or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def encode_scope(scope: str) -> bytes:
    """A scope name as stored: at most SCOPE_BYTES - 1 bytes of UTF-8, cut on a character boundary."""
    raw = scope.encode("utf-8", "replace")[: SCOPE_BYTES - 1]
    return raw.decode("utf-8", "ignore").encode("utf-8")


def create_table(path: str | None, pid: int, start: int) -> mmap.mmap:
    """Create and map a fresh slot file at ``path`` (mode 0600); anonymous when ``path`` is None."""
    if path is None:
        mm = mmap.mmap(-1, FILE_SIZE)
    else:
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, FILE_SIZE)
            mm = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)
    q = memoryview(mm).cast("Q")
    q[H_VERSION] = VERSION
    q[H_PID] = pid
    q[H_START] = start
    q[H_NSLOTS] = NSLOTS
    scope = encode_scope(OVERFLOW_SCOPE)
    mm[SCOPES_OFFSET : SCOPES_OFFSET + 1 + len(scope)] = bytes([len(scope)]) + scope
    q[H_NSCOPES] = 1
    q[H_MAGIC] = MAGIC  # last: a reader that sees the magic sees a complete header
    q.release()
    if path is not None:
        os.replace(f"{path}.tmp", path)  # appears complete or not at all
    return mm


class TableReader:
    """The server's read-only view of one client's slot table."""

    def __init__(self, path: str, uid: int) -> None:
        """Map ``path`` read-only after checking it is a regular file of ``FILE_SIZE`` bytes owned by ``uid``.

        Raises:
            ValueError: the file is not a slot table this server may trust.
        """
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size != FILE_SIZE:
                raise ValueError(f"{path!r} is not a slot table owned by uid {uid} (size {st.st_size})")
            self._mm = mmap.mmap(fd, FILE_SIZE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.path = path
        self.q = memoryview(self._mm).cast("Q")
        self.d = memoryview(self._mm).cast("d")
        if self.q[H_MAGIC] != MAGIC or self.q[H_VERSION] != VERSION or self.q[H_NSLOTS] != NSLOTS:
            self.close()
            raise ValueError(f"{path!r} has a bad slot-table header")

    @property
    def pid(self) -> int:
        """The pid the client wrote (checked against the kernel's view, never trusted alone)."""
        return int(self.q[H_PID])

    @property
    def start(self) -> int:
        """The start time the client wrote."""
        return int(self.q[H_START])

    @property
    def dump_signal(self) -> int:
        """The signal the client registered faulthandler on (0: none)."""
        return int(self.q[H_DUMPSIG])

    @property
    def arms(self) -> int:
        """How many times the client armed a timer (approximate when several threads arm)."""
        return int(self.q[H_ARMS])

    @property
    def closed(self) -> bool:
        """Whether the client closed its table (it stopped using the watchdog)."""
        return bool(self.q[H_CLOSED])

    def armed(self) -> list[tuple[int, float]]:
        """(slot, deadline) for every armed slot."""
        hwm = min(int(self.q[H_HWM]), NSLOTS)
        base = HEADER_WORDS + S_DEADLINE
        deadlines = self.d[base : base + hwm * SLOT_WORDS : SLOT_WORDS].tolist()
        return [(i, dl) for i, dl in enumerate(deadlines) if dl > 0.0]

    def deadline(self, slot: int) -> float:
        """The slot's current deadline (0.0 when disarmed)."""
        return float(self.d[HEADER_WORDS + slot * SLOT_WORDS + S_DEADLINE])

    def slot_info(self, slot: int) -> tuple[float, float, str, int]:
        """(deadline, armed_at, scope, thread) of one slot."""
        base = HEADER_WORDS + slot * SLOT_WORDS
        scope_id = int(self.q[base + S_SCOPE])
        return (
            float(self.d[base + S_DEADLINE]),
            float(self.d[base + S_ARMED_AT]),
            self.scope(scope_id),
            int(self.q[base + S_THREAD]),
        )

    def scope(self, scope_id: int) -> str:
        """The name of scope ``scope_id`` ("?" when out of range)."""
        if not 0 <= scope_id < min(int(self.q[H_NSCOPES]), NSCOPES):
            return "?"
        off = SCOPES_OFFSET + scope_id * SCOPE_BYTES
        n = min(self._mm[off], SCOPE_BYTES - 1)
        return self._mm[off + 1 : off + 1 + n].decode("utf-8", "replace")

    def close(self) -> None:
        """Unmap the table."""
        self.q.release()
        self.d.release()
        self._mm.close()
