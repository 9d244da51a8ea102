"""Same-host shared memory: one private segment per host, written once, read by the host's other ranks.

Steps (every rank of the group takes part in both status exchanges, which are also the memory barriers):

1. Each host's leader (src on its host, else its lowest rank) creates ``/dev/shm/distinit-bc-<port>-<token>-
   <seq>-h<host>`` with ``O_CREAT | O_EXCL``, mode 0600, and writes the payload into it (``pwrite``); across
   hosts src first sends the packed bytes to every other host's leader (point to point).
2. Status exchange "written". Readers then open the segment and check its size, owner and mode.
3. Status exchange "opened". Leaders unlink the segment at once: from here on nothing is left in
   ``/dev/shm`` whatever happens; the memory lives as long as a descriptor or mapping does. Readers read
   into their tensors (``preadv``), or with ``zero_copy`` keep tensors that view a private mapping.

Any failure unlinks the segment (the leader, and best effort the readers, since the leader may be the one
that died). The token is src's random 126 bits, agreed through the group: another job cannot find or
guess a segment, and ``O_EXCL`` refuses a name someone else created.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os

import torch
import torch.distributed as dist

from distinit.broadcast._group import CallContext
from distinit.broadcast._transport import (
    allocate,
    as_bytes,
    copy_back,
    host_buffer,
    is_lazy,
    wait_or_raise,
    wire_view,
)
from distinit.broadcast._via import SHM_DIR, Route, Spec, byte_view, nbytes_of, slots, sync, transport_error, unpack

logger = logging.getLogger("distinit.broadcast")

OK = 0
CREATE_FAILED = 1000  # + errno
ATTACH_FAILED = 2000  # + errno
CHUNK = 1 << 30  # bytes per pwrite/preadv call


def segment_path(ctx: CallContext, route: Route, host: int) -> str:
    """The segment's path: job port, src's random token, call number and host index."""
    job = os.environ.get("MASTER_PORT", "0")
    return os.path.join(SHM_DIR, f"distinit-bc-{job}-{route.token}-{ctx.seq}-h{host}")


class Segment:
    """An open segment: the leader's (created, then written with ``pwrite``) or a reader's (checked, then read).

    Bytes go in and out with system calls, not through a mapping: a full ``/dev/shm`` then fails a write
    with ENOSPC (a write through a mapping would die of SIGBUS), and a copy costs no page fault per 4 KiB
    (measured: reading 256 MiB through a fresh mapping was 4x slower than ``preadv``). Only zero-copy
    receivers map it, privately.
    """

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path, self.fd, self.size = path, fd, size

    @classmethod
    def create(cls, path: str, size: int) -> Segment:
        """Create a new segment, mode 0600 (fails if the name exists: ``O_EXCL``)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            unlink(path)
            raise
        return cls(path, fd, size)

    @classmethod
    def attach(cls, path: str, size: int) -> Segment:
        """Open an existing segment for reading, after checking its size, owner and mode."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        st = os.fstat(fd)
        if st.st_size != size or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(fd)
            raise OSError(errno.EPERM, f"size {st.st_size} (want {size}), uid {st.st_uid}, mode {st.st_mode:o}")
        return cls(path, fd, size)

    def write(self, offset: int, data: torch.Tensor) -> None:
        """Write a CPU contiguous uint8 tensor at ``offset``."""
        view, done = byte_view(data), 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done : done + CHUNK], offset + done)

    def read_into(self, offset: int, out: torch.Tensor) -> None:
        """Fill a CPU contiguous uint8 tensor from ``offset``."""
        view, done = byte_view(out), 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done : done + CHUNK]], offset + done)
            if not got:
                raise OSError(errno.EIO, f"{self.path} ended at {offset + done} bytes, {self.size} expected")
            done += got

    def map_private(self) -> torch.Tensor:
        """The whole segment as a uint8 tensor over a private copy-on-write mapping (writes stay here).

        The tensor keeps the mapping alive (``torch.frombuffer`` holds the mmap object); it is unmapped when
        the last view is freed. Never closed explicitly: that would leave the views dangling.
        """
        return torch.frombuffer(mmap.mmap(self.fd, self.size, access=mmap.ACCESS_COPY), dtype=torch.uint8)

    def close(self) -> None:
        """Close the descriptor (the memory stays while a mapping or another descriptor holds it)."""
        os.close(self.fd)


def unlink(path: str) -> None:
    """Remove a segment's name; gone already is fine (another rank of the host removed it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


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
        BroadcastMismatchError: ``field="transport"``, on every rank: a segment could not be created,
            written or opened on some rank (named, with the errno).
        BroadcastTimeoutError: a peer died or a step timed out (on the waiting rank); the segment is
            unlinked all the same.
    """
    offsets, total = slots(spec)
    host = route.host_of(ctx.rank)
    leader = route.hosts[host][0] == ctx.rank
    path = segment_path(ctx, route, host)
    seg: Segment | None = None
    staging: torch.Tensor | None = None
    try:
        if leader:
            status, seg, staging = _write(ctx, route, path, offsets, total, sources)
        else:
            status = OK
        _check(ctx, sync(ctx, status, "shared-memory write"), "writing")
        if not leader:
            status, seg = _attach(path, total)
        statuses = sync(ctx, status, "shared-memory attach")
        if leader:
            unlink(path)  # every reader of this host has it open: nothing is left behind from here on
        _check(ctx, statuses, "opening")
        if ctx.rank == ctx.src and sources is not None:
            return sources
        if staging is not None:  # a leader that received across hosts holds the bytes already
            return unpack(ctx, staging, spec, offsets, outs, zero_copy=zero_copy)
        if seg is None:  # unreachable: a reader with status OK has opened the segment
            raise RuntimeError(f"{ctx.call}: rank {ctx.rank} has no shared-memory segment to read")
        return _read(ctx, seg, spec, offsets, outs, zero_copy=zero_copy)
    except BaseException:
        unlink(path)  # the leader's, or a reader's best effort when the leader died
        raise
    finally:
        if seg is not None:
            seg.close()


def _write(
    ctx: CallContext, route: Route, path: str, offsets: list[int], total: int, sources: list[torch.Tensor] | None
) -> tuple[int, Segment | None, torch.Tensor | None]:
    """A leader's part: get the bytes (src: its tensors; others: from src across hosts), write its host's segment.

    Returns the status, the segment (None when no other rank shares the host), and the bytes received
    across hosts (None on src).
    """
    is_src = ctx.rank == ctx.src and sources is not None
    packed = None
    if not is_src or len(route.hosts) > 1:  # one contiguous buffer travels between hosts
        packed = torch.empty(total, dtype=torch.uint8)
        if is_src and sources is not None:
            for offset, tensor in zip(offsets, sources, strict=True):
                wire, _ = wire_view(tensor, _CPU)
                packed[offset : offset + wire.numel()].copy_(wire)
        _across_hosts(ctx, route, packed)
    if len(route.hosts[route.host_of(ctx.rank)]) == 1:
        return OK, None, None if is_src else packed
    seg = None
    try:
        seg = Segment.create(path, total)
        if packed is not None:
            seg.write(0, packed)
        else:
            for offset, tensor in zip(offsets, sources or [], strict=True):
                seg.write(offset, wire_view(tensor, _CPU)[0])
    except OSError as exc:  # ENOSPC from a full /dev/shm lands here, never as SIGBUS
        logger.debug("rank %d: cannot create or write %s: %s", ctx.rank, path, exc)
        return CREATE_FAILED + (exc.errno or 0), seg, None if is_src else packed
    return OK, seg, None if is_src else packed


_CPU = torch.device("cpu")


def _across_hosts(ctx: CallContext, route: Route, buf: torch.Tensor) -> None:
    """Src sends the packed bytes to every other host's leader; those receive them (bounded waits).

    Staged through the collective device when it is not the CPU (NCCL sends CUDA tensors only; untested here).
    """
    leaders = [ranks[0] for ranks in route.hosts[1:]]  # hosts[0] is src's host
    wire = buf if ctx.comm_device.type == "cpu" else buf.to(ctx.comm_device)
    if ctx.rank == ctx.src:
        works = [dist.isend(wire, group=ctx.group, group_dst=leader) for leader in leaders]
    elif ctx.rank in leaders:
        works = [dist.irecv(wire, group=ctx.group, group_src=ctx.src)]
    else:
        return
    for work in works:
        wait_or_raise(work, ctx, "transfer between hosts")
    if wire is not buf and ctx.rank != ctx.src:
        buf.copy_(wire)


def _attach(path: str, total: int) -> tuple[int, Segment | None]:
    try:
        return OK, Segment.attach(path, total)
    except OSError as exc:
        logger.debug("cannot open %s: %s", path, exc)
        return ATTACH_FAILED + (exc.errno or 0), None


def _read(
    ctx: CallContext, seg: Segment, spec: Spec, offsets: list[int], outs: list[torch.Tensor | None], *, zero_copy: bool
) -> list[torch.Tensor]:
    """A reader's tensors: views of a private mapping (zero-copy, receivers passing None) or read into buffers."""
    mapped = seg.map_private() if zero_copy and any(out is None for out in outs) else None
    result = []
    for (dtype, shape), offset, out in zip(spec, offsets, outs, strict=True):
        nbytes = nbytes_of(dtype, shape)
        if out is None and mapped is not None and nbytes:
            result.append(mapped[offset : offset + nbytes].view(dtype).view(shape))
            continue
        if out is None:
            out = allocate(ctx, shape, dtype=dtype, device="cpu")
        if nbytes and out.is_cpu and out.is_contiguous() and not is_lazy(out):
            seg.read_into(offset, as_bytes(out))
        elif nbytes:
            staged = host_buffer(nbytes, pinned=out.is_cuda)
            seg.read_into(offset, staged)
            copy_back(out, staged)
        result.append(out)
    return result


def _check(ctx: CallContext, statuses: list[int], step: str) -> None:
    """Raise the same error on every rank when a rank could not create or map its host's segment."""
    bad = {r: _status_text(s) for r, s in enumerate(statuses) if s != OK}
    if bad:
        raise transport_error(
            ctx,
            bad,
            step=f"shared memory ({step})",
            why=f"{SHM_DIR} refused the segment: full, not writable, or not the file this job created",
            fix=f"check {SHM_DIR} on the named ranks' hosts (df, permissions), or pass via='network'",
        )


def _status_text(status: int) -> str:
    if status < ATTACH_FAILED:
        kind, code = "could not create", status - CREATE_FAILED
    else:
        kind, code = "could not map", status - ATTACH_FAILED
    return f"{kind} its host's segment ({errno.errorcode.get(code, code)}: {os.strerror(code)})"
