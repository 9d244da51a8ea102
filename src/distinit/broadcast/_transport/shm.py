"""Same-host shared memory: nameless segments a host's leader writes and the host's other ranks read.

Two kinds of segment, both anonymous memory files (``memfd_create``: never a name in ``/dev/shm``, so a job
SIGKILLed at any step leaves nothing behind; the memory lives exactly as long as a descriptor or mapping):

- **Pooled** (calls where no rank asked for ``zero_copy``): each process keeps, per group, one segment it
  writes whenever it is its host's leader, reused by every later call whose payload fits (a larger one
  replaces it). It is created, mapped writable (shared) once and then sealed ``F_SEAL_FUTURE_WRITE |
  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``, all while the process is not dumpable (its ``/proc/<pid>/fd``
  is root's for those microseconds, so no other process of the user can open the file before the seal).
  From then on nobody, the leader included, can write it with ``write``, map it writable, shrink, grow or
  punch holes in it; only the leader's one mapping, made before the seal, still writes. Readers keep a
  read-only shared mapping of it between calls (checked with ``fstat`` and ``F_GET_SEALS`` every call). The
  pool's total is capped per process (:data:`POOL_ENV`) and released when the group is destroyed and at
  exit.
- **Sealed once** (``zero_copy`` calls, and payloads the cap does not admit): created, written with
  ``pwrite``, sealed ``F_SEAL_WRITE`` (no mapping can write it any more), compared with what was written,
  then read and dropped: a ``zero_copy`` view's pages can never change under it.

Steps (every rank of the group takes part in each status exchange; they are also the memory barriers):

1. Status exchange "plan": each rank's ``zero_copy``, and each leader's pooled segment when the payload
   fits it (pid, descriptor, device, inode).
2. When no rank asked for ``zero_copy`` and every host's leader has a fitting pooled segment (the steady
   state of repeated calls): leaders write the payload into it while readers open (or find in their
   cache) and check it; status exchange "written" carries both; readers copy out. Two exchanges.
3. Otherwise each leader creates (or grows) its pooled segment, or a sealed-once one, and writes it; status
   exchange "written" names it (pid, descriptor, device, inode, kind); readers open ``/proc/<leader
   pid>/fd/<n>`` read-only and check device, inode, owner, size and seals; status exchange "opened"; the
   leader closes a sealed-once segment; readers copy out, or with ``zero_copy`` keep views of it.

A pooled segment is rewritten only by a later call of the same group, after that call's header exchange,
which every rank enters only once it has finished copying out of the previous call: the exchanges order
every rewrite after every read.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import functools
import logging
import mmap
import os
import stat
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from distinit._torch import peer
from distinit.broadcast._group import CallContext
from distinit.broadcast._transport import creator
from distinit.broadcast._transport.pack import (
    Spec,
    byte_view,
    nbytes_of,
    slots,
    sync,
    sync_words,
    transport_error,
    unpack,
    wait_or_raise,
    wire_view,
)

if TYPE_CHECKING:
    from distinit.broadcast._transport.pack import Route

logger = logging.getLogger("distinit.broadcast")

SHM_DIR = "/dev/shm"

OK = 0
CREATE_FAILED = 1000  # + errno
ATTACH_FAILED = 2000  # + errno
CORRUPT = 3001
FOREIGN = 3002
UNSEALED = 3003
BAD_SETTING = 3004
CHUNK = 1 << 30  # bytes per pwrite call
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; Python 3.11's fcntl does not name it
POOL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE
ROW = 5  # status, pid, fd, st_dev, st_ino
VERIFY = True
"""Whether the leader compares a sealed-once segment with what it wrote (the benchmark turns it off to
measure its cost; nothing else should)."""
POOL_ENV = "DISTINIT_SHM_POOL_BYTES"
"""The environment variable capping the bytes of pooled segments one process holds (all groups together);
``0`` turns the pool off. Read by each call."""
POOL_DEFAULT_BYTES = 1 << 30
"""The cap when :data:`POOL_ENV` is unset: 1 GiB per process."""
POOL_PREFIX = f"{creator.PREFIX}pool-"
"""The name (seen only in ``/proc/<pid>/fd`` and ``/proc/<pid>/maps``) of every pooled segment."""

_TEXT = {
    CORRUPT: "found other bytes in its sealed segment than it wrote (another process wrote into it before the seal)",
    FOREIGN: "opened a file that is not the one its leader created (device, inode, size or owner differ)",
    UNSEALED: "found its host's segment not sealed against writes",
}
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault every page in now, an errno (not SIGBUS) when memory lacks
_MADV_DONTFORK = 10  # a child made by fork (a DataLoader worker) neither inherits the mapping nor keeps it alive
_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _libc() -> Any:
    """The C library's ``memcmp``, ``mmap``, ``munmap``, ``madvise`` and ``prctl`` (ctypes releases the GIL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.memcmp.restype, libc.memcmp.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _memcmp() -> Any:
    """The C library's ``memcmp(a, b, n)`` on raw addresses."""
    return _libc().memcmp


def _signed(value: int) -> int:
    """A 64-bit unsigned value (an inode number) as the int64 a status row carries."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _errno_error() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


def _map(fd: int, size: int, *, writable: bool) -> int:
    """``mmap(MAP_SHARED)`` of ``size`` bytes of ``fd``: its address (read-only mappings are pre-faulted)."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    flags = mmap.MAP_SHARED | (0 if writable else mmap.MAP_POPULATE)
    libc = _libc()
    addr = libc.mmap(None, size, prot, flags, fd, 0)
    if addr in (None, _MAP_FAILED):
        raise _errno_error()
    libc.madvise(addr, size, _MADV_DONTFORK)  # advice only: a failure changes nothing we rely on
    return int(addr)


def _over(addr: int, size: int) -> torch.Tensor:
    """A uint8 tensor over ``size`` mapped bytes at ``addr`` (no copy; valid only while the mapping is)."""
    return torch.frombuffer((ctypes.c_ubyte * size).from_address(addr), dtype=torch.uint8)


_HIDE = threading.Lock()


@contextlib.contextmanager
def _hidden() -> Iterator[None]:
    """This process's ``/proc/<pid>/fd`` closed to other processes of its user (not root) while inside.

    A non-dumpable process's ``/proc/<pid>`` entries belong to root: another process of the same user can
    then neither list nor open its descriptors (nor take them with ``pidfd_getfd``). Left as it is when the
    process is not dumpable already.
    """
    libc = _libc()
    with _HIDE:
        if libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 1:
            yield
            return
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        try:
            yield
        finally:
            libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


class Segment:
    """A host's segment: the leader's (created, written with ``pwrite``, sealed) or a reader's (opened, checked).

    Bytes go in with system calls, not through a mapping: a write that cannot get memory then fails with
    an errno (a write through a mapping would die of SIGBUS). Readers map it, after the seal.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size

    @classmethod
    def create(cls, size: int, name: str) -> Segment:
        """A new anonymous memory file of ``size`` bytes, mode 0400, sealable (nothing appears in /dev/shm)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.fchmod(fd, 0o400)  # a same-uid process reopening it through /proc gets it read-only
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size)

    def write(self, offset: int, data: torch.Tensor) -> None:
        """Write a CPU contiguous uint8 tensor at ``offset``."""
        view, done = byte_view(data), 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done : done + CHUNK], offset + done)

    def seal(self) -> None:
        """Forbid every later change of size or content, by anyone (``EBUSY``: someone holds a writable mapping)."""
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)

    def holds(self, written: list[tuple[int, torch.Tensor]]) -> bool:
        """After the seal: whether the segment holds, byte for byte, each ``(offset, uint8 tensor)`` written.

        A comparison, not a checksum: nothing another process wrote before the seal can pass it, and after
        the seal nothing can change. Reads through a private mapping (no copy; unmapped on return) with the C
        library's ``memcmp`` (measured 0.04 s for 256 MiB here, where ``torch.equal`` on one thread took 0.2 s).
        """
        if not self.size:
            return True
        mapped, memcmp = self.map_private(), _memcmp()
        base = mapped.data_ptr()
        return all(memcmp(base + offset, data.data_ptr(), data.numel()) == 0 for offset, data in written)

    def row(self) -> list[int]:
        """What readers need to find and check this segment: OK, pid, descriptor, device, inode."""
        return _row(self.fd)

    @classmethod
    def attach(cls, row: list[int], size: int, *, pooled: bool = False) -> tuple[int, Segment | None]:
        """Open the leader's segment read-only from its status row; a status and the segment, or a status why not.

        A sealed-once segment is exactly ``size`` bytes and sealed against writes; a ``pooled`` one holds at
        least ``size`` bytes and is sealed against new writers (only its leader's mapping writes it).
        """
        _, pid, fd_number, dev, ino = row[:ROW]
        try:
            fd = os.open(f"/proc/{pid}/fd/{fd_number}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            logger.debug("cannot open /proc/%d/fd/%d: %s", pid, fd_number, exc)
            return ATTACH_FAILED + (exc.errno or 0), None
        status = _check_file(fd, dev, ino, size, pooled=pooled)
        if status != OK:
            os.close(fd)
            return status, None
        return OK, cls(fd, os.fstat(fd).st_size if pooled else size)

    def map_private(self) -> torch.Tensor:
        """The whole segment as a uint8 tensor over a private copy-on-write mapping (writes stay here).

        The descriptor is read-only and the segment sealed: no write through this mapping can reach the
        segment, and nobody can change or shrink it under the mapping. The tensor keeps the mapping alive
        (``torch.frombuffer`` holds the mmap object); it is unmapped when the last view is freed.
        """
        return torch.frombuffer(mmap.mmap(self.fd, self.size, access=mmap.ACCESS_COPY), dtype=torch.uint8)

    def close(self) -> None:
        """Close the descriptor (the memory stays while a mapping or another descriptor holds it)."""
        os.close(self.fd)


def _row(fd: int) -> list[int]:
    """A segment's status row: OK, this process's pid, the descriptor, its device and inode."""
    st = os.fstat(fd)
    return [OK, os.getpid(), fd, _signed(st.st_dev), _signed(st.st_ino)]


class _Mapping:
    """A segment's descriptor and one shared mapping of it at ``addr``, released together by :meth:`close`."""

    def __init__(self, fd: int, size: int, addr: int) -> None:
        self.fd, self.size, self.addr = fd, size, addr

    def view(self, size: int) -> torch.Tensor:
        """The first ``size`` bytes as a uint8 tensor (valid until :meth:`close`; never handed to callers)."""
        return _over(self.addr, size)

    def close(self) -> None:
        """Unmap and close: the memory goes once nobody else holds it either."""
        if self.addr:
            _libc().munmap(self.addr, self.size)
            self.addr = 0
            os.close(self.fd)


def _check_file(fd: int, dev: int, ino: int, size: int, *, pooled: bool) -> int:
    """OK when ``fd`` is the leader's file (device, inode, regular, our uid), big enough, and sealed for its kind."""
    try:
        st = os.fstat(fd)
        same = (_signed(st.st_dev), _signed(st.st_ino)) == (dev, ino) and stat.S_ISREG(st.st_mode)
        fits = st.st_size >= size if pooled else st.st_size == size
        if not same or not fits or st.st_uid != os.geteuid():
            logger.debug("segment dev/ino %s/%s, size %d, uid %d", st.st_dev, st.st_ino, st.st_size, st.st_uid)
            return FOREIGN
        need = POOL_SEALS if pooled else SEALS
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & need != need:
            return UNSEALED
    except OSError as exc:
        return ATTACH_FAILED + (exc.errno or 0)
    return OK


class Pooled(_Mapping):
    """A leader's reusable segment: sealed against every new writer, written through the one mapping made before.

    Created once per group (and again when a payload outgrows it): memory file, mode 0400, size, one
    writable shared mapping, seals, all while this process's ``/proc/<pid>/fd`` is closed to other
    processes of its user (:func:`_hidden`): nobody else can hold a writable descriptor or mapping from
    before the seal, and after it nobody can make one. Then every page is allocated (``posix_fallocate``:
    no memory is an errno, not a SIGBUS later) and faulted into the mapping.
    """

    @classmethod
    def create(cls, size: int, name: str) -> Pooled:
        """A new pooled segment of ``size`` bytes (a multiple of the page size), sealed and pre-faulted.

        Raises:
            OSError: no memory for it (``ENOMEM``/``ENOSPC``), or the kernel lacks ``F_SEAL_FUTURE_WRITE``.
        """
        with _hidden():
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            addr = 0
            try:
                os.fchmod(fd, 0o400)
                os.ftruncate(fd, size)
                addr = _map(fd, size, writable=True)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, POOL_SEALS | fcntl.F_SEAL_SEAL)
            except BaseException:
                if addr:
                    _libc().munmap(addr, size)
                os.close(fd)
                raise
        seg = cls(fd, size, addr)
        try:
            os.posix_fallocate(fd, 0, size)
            if _libc().madvise(addr, size, _MADV_POPULATE_WRITE) != 0 and ctypes.get_errno() != errno.EINVAL:
                raise _errno_error()  # EINVAL: a kernel before 5.14; the first write faults the pages in
        except BaseException:
            seg.close()
            raise
        return seg

    def write(self, offset: int, data: torch.Tensor) -> None:
        """Copy a CPU contiguous uint8 tensor in at ``offset`` (through the mapping: the pages are allocated)."""
        if data.numel():
            _over(self.addr + offset, data.numel()).copy_(data)

    def row(self) -> list[int]:
        """What readers need to find and check this segment: OK, pid, descriptor, device, inode."""
        return _row(self.fd)


class Mapped(_Mapping):
    """A reader's read-only shared mapping of a leader's pooled segment, kept between calls (a write faults)."""

    def __init__(self, key: tuple[int, ...], seg: Segment) -> None:
        try:
            addr = _map(seg.fd, seg.size, writable=False)
        except BaseException:
            seg.close()
            raise
        super().__init__(seg.fd, seg.size, addr)
        self.key = key


class GroupPool:
    """What one process holds for one group: the segment it writes as a host leader, and those it reads."""

    def __init__(self) -> None:
        self.mine: Pooled | None = None
        self.read: dict[int, Mapped] = {}  # by the leader's rank in the group
        self.last_auto = -1  # the payload size of the group's last via="auto" call (see :func:`repeated`)

    def drop_mine(self) -> None:
        """Release the segment this process writes as a leader (its readers let it go at their next call)."""
        if self.mine is not None:
            self.mine.close()
            self.mine = None

    def close(self) -> None:
        """Release every segment and mapping (at the group's destruction and at exit)."""
        released = self.mine.size if self.mine is not None else 0
        self.drop_mine()
        for mapped in self.read.values():
            mapped.close()
        self.read.clear()
        if released:
            logger.debug(
                "released a pooled shared-memory segment of %d bytes (group destroyed or exit); %d bytes pooled",
                released, pool_bytes(),
                extra={"distinit": {"event": "broadcast.pool", "action": "release", "nbytes": released,
                                    "pooled": pool_bytes()}},
            )  # fmt: skip


_POOLS: weakref.WeakKeyDictionary[Any, GroupPool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.RLock()  # re-entered when a collected group's finalizer runs inside a locked section


def _pool_of(group: Any) -> GroupPool:
    """The group's pool in this process, made on first use; released by ``weakref.finalize`` with the group."""
    with _POOLS_LOCK:
        pool = _POOLS.get(group)
        if pool is None:
            pool = _POOLS[group] = GroupPool()
            weakref.finalize(group, pool.close)  # also runs at exit (atexit) for groups still alive
        return pool


def repeated(group: Any, total: int) -> bool:
    """Whether the group's previous ``via="auto"`` call moved ``total`` bytes too; records this call.

    Every rank of a group verifies the same calls in the same order, so every rank answers alike without a
    collective (``via="auto"`` takes the pool only from the second call of a layout: its first pays for it).
    """
    pool = _pool_of(group)
    again, pool.last_auto = pool.last_auto == total, total
    return again


def pool_bytes() -> int:
    """Bytes of pooled segments this process holds as a host leader, all groups together."""
    with _POOLS_LOCK:
        return sum(p.mine.size for p in list(_POOLS.values()) if p.mine is not None)


def pool_cap() -> int | None:
    """The cap on :func:`pool_bytes` from :data:`POOL_ENV` (default :data:`POOL_DEFAULT_BYTES`); None if malformed."""
    text = os.environ.get(POOL_ENV, "").strip()
    if not text:
        return POOL_DEFAULT_BYTES
    return int(text) if text.isascii() and text.isdigit() else None  # not '²': int() refuses it


def _pooled_size(total: int) -> int:
    page = mmap.PAGESIZE
    return -(-total // page) * page


@dataclasses.dataclass(frozen=True)
class _Call:
    """One transfer's facts, the same at each of its steps: the call, its route and payload, this rank's part."""

    ctx: CallContext
    route: Route
    spec: Spec
    offsets: list[int]
    total: int
    sources: list[torch.Tensor] | None  # src's tensors (src only)
    outs: list[torch.Tensor | None]  # a receiver's buffers (None: allocate, or view with zero_copy)

    @property
    def host(self) -> tuple[int, ...]:
        """This rank's host: its ranks, the leader first."""
        return self.route.hosts[self.route.host_of(self.ctx.rank)]

    def done(self, data: torch.Tensor | None, *, zero_copy: bool) -> list[torch.Tensor]:
        """This rank's tensors: src's own, or unpacked from ``data`` (the bytes received across hosts, or read)."""
        if self.ctx.rank == self.ctx.src and self.sources is not None:
            return self.sources
        if data is None:  # unreachable: every rank other than src has bytes to unpack by now
            raise RuntimeError(f"{self.ctx.call}: rank {self.ctx.rank} has no shared-memory bytes to read")
        return unpack(self.ctx, data, self.spec, self.offsets, self.outs, zero_copy=zero_copy)


def transfer(
    ctx: CallContext,
    route: Route,
    spec: Spec,
    sources: list[torch.Tensor] | None,
    outs: list[torch.Tensor | None],
    zero_copy: bool,
) -> list[torch.Tensor]:
    """Move src's tensors to every rank through each host's segment; returns this rank's tensors.

    ``sources``: src's tensors (src only). ``outs``: receivers' buffers to fill, ``None`` where a tensor is
    to be allocated (or, with ``zero_copy``, to view the shared pages).

    Raises:
        BroadcastMismatchError: on every rank: a segment could not be created, written, sealed or opened on
            some rank (``field="transport"``, named, with the errno), ``DISTINIT_SHM_POOL_BYTES`` is not a
            number on some rank, or a leader read back other bytes from its sealed segment than it wrote, or
            a reader found it was not its leader's sealed segment (``field="payload"``); no receiver's buffer
            was written then.
        BroadcastTimeoutError: a peer died or a step timed out (on the waiting rank).
    """
    offsets, total = slots(spec)
    call = _Call(ctx, route, spec, offsets, total, sources, outs)
    leader = call.host[0]
    pool = _pool_of(ctx.group)
    cap = pool_cap()
    plan = [OK if cap is not None else BAD_SETTING, int(zero_copy), 0, 0, 0, 0]
    if leader == ctx.rank and pool.mine is not None and cap is not None:
        if pool.mine.size > cap:  # the cap was lowered since: let it go
            pool.drop_mine()
        elif pool.mine.size >= total:
            plan[2:] = pool.mine.row()[1:]
    plans = sync_words(ctx, plan, "shared-memory plan")
    _check(ctx, [p[0] for p in plans], "planning")
    views = any(p[1] for p in plans)
    shared = [ranks for ranks in route.hosts if len(ranks) > 1]
    if not views and all(plans[ranks[0]][2] for ranks in shared):
        return _reuse(call, pool, plans[leader])
    return _fresh(call, zero_copy, pool if not views else None, cap)


def _reuse(call: _Call, pool: GroupPool, plan: list[int]) -> list[torch.Tensor]:
    """Every host's pooled segment fits: leaders write into theirs while readers open (or reuse) and check it."""
    ctx, leader = call.ctx, call.host[0]
    staging = None
    if leader == ctx.rank:
        staging, written = _payload(call)
        if pool.mine is not None and len(call.host) > 1:
            for offset, data in written:
                pool.mine.write(offset, data)
        status = OK
    else:
        status = _attach_pooled(pool, leader, [OK, *plan[2:]], call.total)
    _check(ctx, sync(ctx, status, "shared-memory write"), "opening")
    if staging is None and leader != ctx.rank:
        staging = pool.read[leader].view(call.total)
    return call.done(staging, zero_copy=False)


def _attach_pooled(pool: GroupPool, leader: int, row: list[int], total: int) -> int:
    """Find the leader's pooled segment in this reader's cache (checked again), or open, check and map it."""
    key = tuple(row[1:ROW])
    cached = pool.read.get(leader)
    if cached is not None and cached.key == key:
        return _check_file(cached.fd, row[3], row[4], total, pooled=True)
    if cached is not None:  # the leader replaced it (grown) or another process leads now: let the old one go
        cached.close()
        del pool.read[leader]
    status, seg = Segment.attach(row, total, pooled=True)
    if seg is None:
        return status
    try:
        pool.read[leader] = Mapped(key, seg)
    except OSError as exc:
        return ATTACH_FAILED + (exc.errno or 0)
    return OK


def _payload(call: _Call) -> tuple[torch.Tensor | None, list[tuple[int, torch.Tensor]]]:
    """A leader's bytes: src's tensors (wire views), or what src sent across hosts (received here).

    Returns the bytes received across hosts (None on src) and the ``(offset, uint8 tensor)`` pieces to write.
    """
    ctx, sources, offsets = call.ctx, call.sources, call.offsets
    is_src = ctx.rank == ctx.src and sources is not None
    packed = None
    if not is_src or len(call.route.hosts) > 1:  # one contiguous buffer travels between hosts
        packed = torch.empty(call.total, dtype=torch.uint8)
        if is_src and sources is not None:
            for offset, tensor in zip(offsets, sources, strict=True):
                wire, _ = wire_view(tensor, _CPU)
                packed[offset : offset + wire.numel()].copy_(wire)
        _across_hosts(ctx, call.route, packed)
    if packed is None:  # src's own tensors (views, or staging copies of CUDA or strided ones, kept to compare)
        written = [(o, wire_view(t, _CPU)[0]) for o, t in zip(offsets, sources or [], strict=True)]
    else:
        written = [(o, packed[o : o + nbytes_of(d, s)]) for (d, s), o in zip(call.spec, offsets, strict=True)]
    return (None if is_src else packed), written


def _fresh(call: _Call, zero_copy: bool, pool: GroupPool | None, cap: int | None) -> list[torch.Tensor]:
    """Create (or grow) the segments, name them in one exchange, open them, confirm in another, read them."""
    ctx, leader, total = call.ctx, call.host[0], call.total
    seg: Segment | None = None
    pooled: Pooled | None = None
    staging: torch.Tensor | None = None
    try:
        if leader == ctx.rank:
            status, seg, pooled, staging = _write(call, pool, cap)
            made = pooled if pooled is not None else seg
            row = made.row() if made is not None and status == OK else [status] + [0] * (ROW - 1)
        else:
            row = [OK] + [0] * (ROW - 1)
        rows = sync_words(ctx, [*row, int(pooled is not None)], "shared-memory write")
        _check(ctx, [r[0] for r in rows], "writing")
        if leader != ctx.rank:
            if rows[leader][ROW] and pool is not None:
                status = _attach_pooled(pool, leader, rows[leader], total)
            else:
                status, seg = Segment.attach(rows[leader], total)
        statuses = sync(ctx, status if leader != ctx.rank else OK, "shared-memory attach")
        if leader == ctx.rank and seg is not None:
            seg.close()  # every reader of this host holds its own descriptor now
            seg = None
        _check(ctx, statuses, "opening")
        if staging is not None or leader == ctx.rank:  # src, or a leader that received across hosts
            return call.done(staging, zero_copy=zero_copy)
        if seg is None:  # a pooled segment: copy out (no rank asked for views)
            return call.done(pool.read[leader].view(total) if pool is not None else None, zero_copy=False)
        return call.done(seg.map_private() if total else torch.empty(0, dtype=torch.uint8), zero_copy=zero_copy)
    finally:
        if seg is not None:
            seg.close()


def _write(
    call: _Call, pool: GroupPool | None, cap: int | None
) -> tuple[int, Segment | None, Pooled | None, torch.Tensor | None]:
    """A leader's part: get the bytes (src: its tensors; others: from src across hosts), write the segment.

    Into the group's pooled segment when ``pool`` is given (no rank wants views) and the cap admits it
    (created or grown here), else into a new sealed-once segment. Returns the status, the sealed-once
    segment or the pooled one (None when no other rank shares the host), and the bytes received across
    hosts (None on src).
    """
    ctx, total = call.ctx, call.total
    received, written = _payload(call)
    if len(call.host) == 1:
        return OK, None, None, received
    if pool is not None and cap is not None:
        try:
            pooled = _grow(ctx, pool, total, cap)
        except OSError as exc:  # no memory for it, or a kernel without F_SEAL_FUTURE_WRITE (before 5.1)
            logger.debug("rank %d: cannot pool a segment of %d bytes (%s): a sealed-once one", ctx.rank, total, exc)
            pooled = None
        if pooled is not None:
            for offset, data in written:
                pooled.write(offset, data)
            return OK, None, pooled, received
    seg = None
    try:
        seg = Segment.create(total, f"{creator.PREFIX}{creator.tag()}-{ctx.seq}")
        for offset, data in written:
            seg.write(offset, data)
        seg.seal()
        if VERIFY and not seg.holds(written):
            logger.debug("rank %d: its sealed segment does not hold what it wrote", ctx.rank)
            seg.close()
            return CORRUPT, None, None, received
    except OSError as exc:  # no memory (ENOMEM/ENOSPC), or EBUSY: someone mapped it writable before the seal
        logger.debug("rank %d: cannot create, write or seal its host's segment: %s", ctx.rank, exc)
        if seg is not None:
            seg.close()
        return CREATE_FAILED + (exc.errno or 0), None, None, received
    return OK, seg, None, received


_ABOVE_CAP_SAID = False


def _grow(ctx: CallContext, pool: GroupPool, total: int, cap: int) -> Pooled | None:
    """The group's pooled segment, made or replaced to hold ``total`` bytes; None when the cap does not admit it.

    Raises:
        OSError: no memory for a new segment.
    """
    global _ABOVE_CAP_SAID
    if pool.mine is not None and pool.mine.size >= total:
        return pool.mine
    size = _pooled_size(total)
    pool.drop_mine()  # grow = replace: readers drop the old one when they see the new one's row
    others = pool_bytes()
    if cap == 0:  # the pool is off
        return None
    if others + size > cap:
        if not _ABOVE_CAP_SAID:
            _ABOVE_CAP_SAID = True
            logger.info(
                "rank %d: %s call #%d: %d bytes by shared memory would bring the segment pool to %d bytes, above "
                "its cap of %d (%s): such calls allocate a fresh segment each time (said once per process)",
                ctx.rank, ctx.call, ctx.seq, total, others + size, cap, POOL_ENV,
                extra={"distinit": {"event": "broadcast.pool", "action": "above_cap", "nbytes": total,
                                    "pooled": others, "cap": cap}},
            )  # fmt: skip
        return None
    pool.mine = Pooled.create(size, f"{POOL_PREFIX}{creator.tag()}")
    logger.debug(
        "rank %d: %s call #%d: pooled a shared-memory segment of %d bytes; %d bytes pooled of %d (%s)",
        ctx.rank, ctx.call, ctx.seq, size, others + size, cap, POOL_ENV,
        extra={"distinit": {"event": "broadcast.pool", "action": "create", "nbytes": size, "pooled": others + size,
                            "cap": cap}},
    )  # fmt: skip
    return pool.mine


_CPU = torch.device("cpu")


def _across_hosts(ctx: CallContext, route: Route, buf: torch.Tensor) -> None:
    """Src sends the packed bytes to every other host's leader; those receive them (bounded waits).

    Staged through the collective device when it is not the CPU (NCCL sends CUDA tensors only; untested here).
    """
    leaders = [ranks[0] for ranks in route.hosts[1:]]  # hosts[0] is src's host
    wire = buf if ctx.comm_device.type == "cpu" else buf.to(ctx.comm_device)
    if ctx.rank == ctx.src:
        works = [dist.isend(wire, group=ctx.group, **peer("isend", "dst", leader, ctx.group)) for leader in leaders]
    elif ctx.rank in leaders:
        works = [dist.irecv(wire, group=ctx.group, **peer("irecv", "src", ctx.src, ctx.group))]
    else:
        return
    for work in works:
        wait_or_raise(work, ctx, "transfer between hosts")
    if wire is not buf and ctx.rank != ctx.src:
        buf.copy_(wire)


def _check(ctx: CallContext, statuses: list[int], step: str) -> None:
    """Raise the same error on every rank when some rank could not create, open or verify its host's segment."""
    bad = {r: _status_text(s) for r, s in enumerate(statuses) if s != OK}
    if not bad:
        return
    if all(s == BAD_SETTING for s in statuses if s != OK):
        why = f"{POOL_ENV} caps the bytes of reusable shared-memory segments a process keeps; it must be a number"
        fix = f"set {POOL_ENV} to a whole number of bytes (0 turns the pool off), or unset it for 1 GiB"
        field = "transport"
    elif all(s in _TEXT for s in statuses if s != OK):
        why = ("another process changed or replaced the segment between its creation and its seal; only a "
               "process of the same user (or root) can, through /proc/<pid>/fd")  # fmt: skip
        fix = "find the process of your user that opens other processes' descriptors, or pass via='network'"
        field = "payload"
    else:
        why = ("the host had no memory for the segment, a process held it mapped writable when the leader "
               "sealed it, or a reader cannot open /proc/<leader pid>/fd (hidepid, a non-dumpable leader)")  # fmt: skip
        fix = f"check free memory and {SHM_DIR} on the named ranks' hosts, or pass via='network'"
        field = "transport"
    raise transport_error(ctx, bad, step=f"shared memory ({step})", why=why, fix=fix, field=field)


def _status_text(status: int) -> str:
    if status == BAD_SETTING:
        return f"has a {POOL_ENV} that is not a whole number of bytes"
    if status in _TEXT:
        return _TEXT[status]
    if status < ATTACH_FAILED:
        kind, code = "could not create, write or seal", status - CREATE_FAILED
    else:
        kind, code = "could not open", status - ATTACH_FAILED
    return f"{kind} its host's segment ({errno.errorcode.get(code, code)}: {os.strerror(code)})"
