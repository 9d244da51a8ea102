"""The per-client slot table: a small shared-memory file that clients write and the server reads.

Layout (native byte order, every field 8 bytes and 8-byte aligned so each store is one machine store)::

    header   16 words   magic, version, pid, start_time, nslots, high-water mark, dump signal,
                        arms counter, closed flag, scope count, rank + 1, local rank + 1,
                        world size + 1 (0: unknown; zero in tables of older clients), reserved...
    slots    NSLOTS x 4 words   deadline (f64, CLOCK_MONOTONIC s; 0 = free), armed_at (f64),
                                scope id (u64), thread ident (u64)
    scopes   NSCOPES x SCOPE_BYTES   1-byte length + UTF-8 name

Arming writes the scope id, thread and arm time, then the deadline last; disarming writes 0.0 to the deadline.
Those are plain memory stores into an mmap: no system call, nothing that can block or fail. The file outlives
the server, so a restarted server resumes every armed deadline.

The server never maps a table: it copies what it reads with ``pread`` into its own memory. A mapping of a file
it does not control would let whoever truncates the file kill the server with SIGBUS.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import threading
from types import CodeType, FrameType

from distinit.watchdog._protocol import Identity

MAGIC = int.from_bytes(b"DWDGSLT1", "little")
VERSION = 1
HEADER_WORDS = 16
NSLOTS = 1024
SLOT_WORDS = 4
NSCOPES = 512
SCOPE_BYTES = 96
WORD_BYTES = 8
SLOTS_OFFSET = HEADER_WORDS * WORD_BYTES
SCOPES_OFFSET = SLOTS_OFFSET + NSLOTS * SLOT_WORDS * WORD_BYTES
FILE_SIZE = SCOPES_OFFSET + NSCOPES * SCOPE_BYTES

# Header word indices.
H_MAGIC, H_VERSION, H_PID, H_START, H_NSLOTS, H_HWM, H_DUMPSIG, H_ARMS, H_CLOSED, H_NSCOPES = range(10)
# The worker's identity, each stored plus one so that 0 (a table of an older client) reads as unknown.
H_RANK, H_LOCAL_RANK, H_WORLD_SIZE = range(10, 13)
# Offsets inside one slot.
S_DEADLINE, S_ARMED_AT, S_SCOPE, S_THREAD = range(4)
OVERFLOW_SCOPE = "<scope table full>"
# ASCII digits only: str.isdigit() also accepts "²", which int() then refuses.
_FILE_NAME = re.compile(r"([0-9]{1,10})\.([0-9]{1,20})\.slots", re.ASCII)


def slot_base(slot: int) -> int:
    """The word index of slot ``slot``'s first field; add ``S_DEADLINE``, ``S_SCOPE``... to it."""
    return HEADER_WORDS + slot * SLOT_WORDS


def slot_file_name(pid: int, start: int) -> str:
    """The slot file name for one process: ``<pid>.<start time>.slots``."""
    return f"{pid}.{start}.slots"


def stack_file_name(pid: int, start: int) -> str:
    """The stack-dump file name for one process: ``<pid>.<start time>.stack``."""
    return f"{pid}.{start}.stack"


def parse_file_name(name: str) -> tuple[int, int] | None:
    """(pid, start) from a slot file name, None if the name is not one."""
    match = _FILE_NAME.fullmatch(name)
    if match is None:
        return None
    return int(match[1]), int(match[2])


def encode_scope(scope: str) -> bytes:
    """A scope name as stored: at most SCOPE_BYTES - 1 bytes of UTF-8, cut on a character boundary."""
    raw = scope.encode("utf-8", "replace")[: SCOPE_BYTES - 1]
    return raw.decode("utf-8", "ignore").encode("utf-8")


def create_table(path: str | None, pid: int, start: int, identity: Identity | None = None) -> mmap.mmap:
    """Create and map a fresh slot file at ``path`` (mode 0600); anonymous when ``path`` is None.

    ``identity`` (the worker's ranks) is recorded for a server that adopts the table without a hello.
    """
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
    ident = identity or Identity()
    for word, value in ((H_RANK, ident.rank), (H_LOCAL_RANK, ident.local_rank), (H_WORLD_SIZE, ident.world_size)):
        q[word] = 0 if value is None else value + 1
    q[H_MAGIC] = MAGIC  # last: a reader that sees the magic sees a complete header
    q.release()
    if path is not None:
        os.replace(f"{path}.tmp", path)  # appears complete or not at all
    return mm


class ScopeNames:
    """The client's side of the scope table: each name is written once and known by its index after."""

    def __init__(self, mm: mmap.mmap) -> None:
        """Intern names into the table mapped at ``mm`` (created by :func:`create_table`)."""
        self._mm = mm
        self._q = memoryview(mm).cast("Q")
        self._lock = threading.Lock()
        self.ids: dict[str, int] = {OVERFLOW_SCOPE: 0}
        self._frames: dict[tuple[CodeType, int], int] = {}

    def intern(self, scope: str) -> int:
        """The id of ``scope``, writing it into the table the first time (0: the table is full)."""
        with self._lock:
            sid = self.ids.get(scope)
            if sid is not None:
                return sid
            n = int(self._q[H_NSCOPES])
            if n >= NSCOPES:
                return 0
            raw = encode_scope(scope)
            off = SCOPES_OFFSET + n * SCOPE_BYTES
            self._mm[off : off + 1 + len(raw)] = bytes([len(raw)]) + raw
            self._q[H_NSCOPES] = n + 1  # after the name: a reader never sees a half-written one
            self.ids[scope] = n
            return n

    def of_frame(self, frame: FrameType) -> int:
        """The id of the default scope ``file:line`` of ``frame`` (cached per code location)."""
        key = (frame.f_code, frame.f_lineno)
        sid = self._frames.get(key)
        if sid is None:
            sid = self.intern(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            self._frames[key] = sid
        return sid


class TableDamaged(ValueError):
    """A slot table changed under the server: truncated, or no longer readable as one."""


class TableReader:
    """The server's read-only view of one client's slot table, read with ``pread`` (never mapped).

    Every read copies bytes into the server's memory and checks their length, so a table truncated or
    replaced by someone else raises :class:`TableDamaged` (a ``ValueError``) instead of a SIGBUS.
    """

    def __init__(self, path: str, uid: int) -> None:
        """Open ``path`` after checking it is a regular 0600 file of ``FILE_SIZE`` bytes owned by ``uid``.

        Opened non-blocking and without following links, then checked with ``fstat`` before any read, so a
        FIFO or a symlink planted under the name can neither block nor redirect the server.

        Raises:
            OSError: the file cannot be opened (``ELOOP`` for a symlink).
            ValueError: the file is not a slot table this server may trust.
        """
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size != FILE_SIZE or st.st_mode & 0o077:
                raise ValueError(
                    f"{path!r} is not a 0600 slot table owned by uid {uid} "
                    f"(mode {st.st_mode:o}, owner {st.st_uid}, size {st.st_size})"
                )
            self._fd = fd
            header = self._header()
        except BaseException:
            os.close(fd)
            raise
        self.path = path
        self.dev, self.ino = st.st_dev, st.st_ino
        if header[H_MAGIC] != MAGIC or header[H_VERSION] != VERSION or header[H_NSLOTS] != NSLOTS:
            self.close()
            raise ValueError(f"{path!r} has a bad slot-table header")
        self.pid, self.start = int(header[H_PID]), int(header[H_START])

    def _read(self, offset: int, size: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise TableDamaged(f"{self.path!r} is shorter than a slot table: it was truncated")
        return data

    def _header(self) -> memoryview:
        return memoryview(self._read(0, SLOTS_OFFSET)).cast("Q")

    @property
    def dump_signal(self) -> int:
        """The signal the client registered faulthandler on (0: none)."""
        return int(self._header()[H_DUMPSIG])

    @property
    def arms(self) -> int:
        """How many times the client armed a timer (approximate when several threads arm)."""
        return int(self._header()[H_ARMS])

    @property
    def identity(self) -> Identity:
        """The ranks the client recorded (unknown fields in a table of an older client)."""
        h = self._header()
        known = [int(h[w]) - 1 if 0 < h[w] <= 2**31 else None for w in (H_RANK, H_LOCAL_RANK, H_WORLD_SIZE)]
        return Identity(rank=known[0], local_rank=known[1], world_size=known[2])

    @property
    def closed(self) -> bool:
        """Whether the client closed its table (it stopped using the watchdog)."""
        return bool(self._header()[H_CLOSED])

    def armed(self) -> list[tuple[int, float]]:
        """(slot, deadline) for every armed slot."""
        hwm = min(int(self._header()[H_HWM]), NSLOTS)
        if hwm == 0:
            return []
        words = memoryview(self._read(SLOTS_OFFSET, hwm * SLOT_WORDS * WORD_BYTES)).cast("d")
        deadlines = words[S_DEADLINE::SLOT_WORDS].tolist()
        return [(i, dl) for i, dl in enumerate(deadlines) if dl > 0.0]

    def _slot(self, slot: int) -> bytes:
        return self._read(SLOTS_OFFSET + slot * SLOT_WORDS * WORD_BYTES, SLOT_WORDS * WORD_BYTES)

    def deadline(self, slot: int) -> float:
        """The slot's current deadline (0.0 when disarmed)."""
        return float(memoryview(self._slot(slot)).cast("d")[S_DEADLINE])

    def slot_info(self, slot: int) -> tuple[float, float, str, int]:
        """(deadline, armed_at, scope, thread) of one slot."""
        raw = self._slot(slot)
        d, q = memoryview(raw).cast("d"), memoryview(raw).cast("Q")
        return float(d[S_DEADLINE]), float(d[S_ARMED_AT]), self.scope(int(q[S_SCOPE])), int(q[S_THREAD])

    def scope(self, scope_id: int) -> str:
        """The name of scope ``scope_id`` ("?" when out of range)."""
        if not 0 <= scope_id < min(int(self._header()[H_NSCOPES]), NSCOPES):
            return "?"
        raw = self._read(SCOPES_OFFSET + scope_id * SCOPE_BYTES, SCOPE_BYTES)
        return raw[1 : 1 + min(raw[0], SCOPE_BYTES - 1)].decode("utf-8", "replace")

    def close(self) -> None:
        """Close the table's file descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
