"""The fixed-size int64 header every rank contributes to each call, and its exchange.

Every rank sends its ``[HEADER_WORDS]`` int64 row to every rank of the group (on gloo one
``all_to_all_single``, on NCCL one all_gather: see :func:`exchange`), so each rank holds every
rank's view of the call and all ranks reach the same verdict from the same facts. The row is the
same size for every call kind, so ranks that disagree on *which* call they make still exchange
equal-sized buffers: gloo aborts the process (SIGABRT) when sizes differ, which is the failure we
exist to prevent. Small payloads (up to :data:`INLINE_BYTES`) ride inside src's row, so a small broadcast costs one
collective instead of two. Groups of :data:`distinit.broadcast._digest.DIGEST_FROM` ranks or more send their
rows through one all_reduce of a digest instead (:mod:`distinit.broadcast._digest`), and exchange the rows
only when that digest shows a difference.

Why all-to-all rather than all_gather or all_reduce (``benchmarks/bench_broadcast.py`` measures the
header; the primitive comparison is in docs/broadcast.md): gloo's all_gather is a ring (world - 1
sequential steps; 2-3x a 1 KB broadcast at world 2, ~4x at world 4) and its all_reduce costs ~1 ms
for a few words, while its all-to-all sends every pair at once and costs about one small broadcast
at world 2. Protocol version 3 (2 had no ``W_LIMIT`` word; 1 used all_gather; mixing versions is not
supported: a peer of another version gets a "protocol" mismatch).
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

MAGIC = 0x64697374_62630003  # "distbc" + protocol version 3
MAX_NDIM = 12
FIXED_WORDS = 32
INLINE_BYTES = 4096
"""Payloads up to this many bytes ride inside the header collective (one collective per call).

A protocol constant rather than a per-call option: ranks that disagreed on it would exchange
differently sized rows, which gloo answers with SIGABRT.
"""
HEADER_WORDS = FIXED_WORDS + INLINE_BYTES // 8
HEADER_BYTES = HEADER_WORDS * 8
FIXED_BYTES = FIXED_WORDS * 8
_FIXED = struct.Struct(f"={FIXED_WORDS}q")  # native byte order, as an int64 tensor would hold it

# Word offsets in a row.
W_MAGIC, W_SEQ, W_OP, W_SRC, W_HAS_BUFFER, W_STATUS, W_DTYPE, W_DEVICE, W_NDIM = range(9)
W_SHAPE = 9  # MAX_NDIM words
W_NBYTES = W_SHAPE + MAX_NDIM  # 21
W_FINGERPRINT = 22
W_COUNT = 23
W_AUX_NBYTES = 24
W_INLINE = 25
W_GLOBAL_RANK = 26
W_FLAGS = 27
W_LIMIT = 28  # the most payload bytes this rank accepts (broadcast_object's max_bytes=); 0 when unused

FLAG_FLAT = 1
"""``W_FLAGS`` bit: this rank's module is flattened (:func:`distinit.flatten_module_`) and can move zero-copy."""
FLAG_ZERO_COPY = 2
"""``W_FLAGS`` bit: this rank asked for ``zero_copy``; the only per-rank transport fact ``via="auto"`` needs, so the
header verdict settles auto's route without a collective of its own when no rank asked (ranks may differ)."""

OP_TENSOR, OP_OBJECT, OP_STATE_DICT, OP_MODULE = 1, 2, 3, 4
OP_NAMES = {
    OP_TENSOR: "broadcast_tensor",
    OP_OBJECT: "broadcast_object",
    OP_STATE_DICT: "broadcast_state_dict",
    OP_MODULE: "broadcast_module",
}

NOT_INLINE = -1


@dataclasses.dataclass(slots=True)
class View:
    """One rank's view of a call: the fixed words of its header row, decoded (slotted: cheap to build)."""

    magic: int
    seq: int
    op: int
    src: int
    has_buffer: bool
    status: int
    dtype: int
    device: int
    ndim: int
    shape: tuple[int, ...]
    nbytes: int
    fingerprint: int
    count: int
    aux_nbytes: int
    inline: int
    global_rank: int
    flags: int
    limit: int

    @classmethod
    def from_words(cls, words: Sequence[int]) -> View:
        """Decode the first :data:`FIXED_WORDS` words of a row (garbage-tolerant: never raises)."""
        w = words if type(words) is tuple else tuple(int(x) for x in words[:FIXED_WORDS])
        ndim = w[W_NDIM]
        # Positional, in field order: this runs for every row of every call, and keyword arguments
        # measured 0.9 µs more per row (2.1 -> 3.0 µs), several % of a small call's Python.
        return cls(w[W_MAGIC], w[W_SEQ], w[W_OP], w[W_SRC], bool(w[W_HAS_BUFFER]), w[W_STATUS], w[W_DTYPE],
                   w[W_DEVICE], ndim, w[W_SHAPE : W_SHAPE + max(0, min(ndim, MAX_NDIM))], w[W_NBYTES],
                   w[W_FINGERPRINT], w[W_COUNT], w[W_AUX_NBYTES], w[W_INLINE], w[W_GLOBAL_RANK],
                   w[W_FLAGS], w[W_LIMIT])  # fmt: skip


def fixed_words(
    *,
    seq: int,
    op: int,
    src: int,
    has_buffer: bool = False,
    status: int = 0,
    dtype: int = 0,
    device: int = 0,
    shape: Sequence[int] | None = None,
    nbytes: int = 0,
    fingerprint: int = 0,
    count: int = 0,
    aux_nbytes: int = 0,
    inline: int = NOT_INLINE,
    global_rank: int = -1,
    flags: int = 0,
    limit: int = 0,
) -> list[int]:
    """The :data:`FIXED_WORDS` words of this rank's row (``shape=None``: no tensor view, ndim -1).

    Built as one list display (the hot path of every call); ``len(shape) <= MAX_NDIM`` is the
    caller's to check (broadcast_tensor reports a deeper tensor in its status word instead).
    """
    if shape is None:
        ndim, dims = -1, _NO_SHAPE
    else:
        ndim = len(shape)
        dims = [*shape, *_NO_SHAPE[ndim:]]
    return [MAGIC, seq, op, src, 1 if has_buffer else 0, status, dtype, device, ndim, *dims,
            nbytes, fingerprint, count, aux_nbytes, inline, global_rank, flags, limit, *_TAIL]  # fmt: skip


_NO_SHAPE = [0] * MAX_NDIM
_TAIL = [0] * (FIXED_WORDS - W_LIMIT - 1)


class Scratch:
    """A group's reusable all-to-all buffers: fresh ones cost more than the rows (~6 µs a call in gloo).

    Taken without blocking by one call at a time (:meth:`take`); a call whose collective failed never
    gives them back, since gloo may still be using them, and later calls then use fresh buffers.
    The :class:`Exchange` built from the receive table copies out what it keeps before they are
    given back, so nothing returned to a caller aliases them.
    """

    __slots__ = ("address", "buffer", "dirty", "lock", "recv", "recv_tensor", "tensor")

    def __init__(self, group_size: int) -> None:
        self.buffer = bytearray(group_size * HEADER_BYTES)  # send rows
        self.tensor = torch.frombuffer(self.buffer, dtype=torch.int64)  # pins the size: never resized
        self.address = address_of(self.buffer)
        self.recv = bytearray(group_size * HEADER_BYTES)
        self.recv_tensor = torch.frombuffer(self.recv, dtype=torch.int64)
        self.dirty = 0  # inline bytes the previous call left in row 0, zeroed before a shorter payload
        self.lock = threading.Lock()

    def take(self) -> bool:
        """Claim the buffers for one exchange; False when another call (another thread) holds them."""
        return self.lock.acquire(blocking=False)

    def give_back(self) -> None:
        """Release the buffers after the exchange completed and its table was decoded."""
        self.lock.release()


class GatherScratch:
    """A CUDA (NCCL) group's reusable header buffers, per device: pinned host rows and their device twins.

    A small NCCL call would otherwise allocate a device table and copy it into a fresh pageable host
    buffer on every call. Allocated on the group's first call on a device (NCCL runs on the device current
    at the call), then reused; taken by one call at a time like :class:`Scratch`, and never given back by
    a call whose collective failed (the device may still write into them).
    """

    __slots__ = ("by_device", "group_size", "lock")

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self.by_device: dict[torch.device, DeviceRows] = {}
        self.lock = threading.Lock()

    def take(self) -> bool:
        """Claim the buffers for one exchange; False when another call (another thread) holds them."""
        return self.lock.acquire(blocking=False)

    def give_back(self) -> None:
        """Release the buffers after the exchange completed and its table was decoded."""
        self.lock.release()

    def on(self, device: torch.device) -> DeviceRows:
        """The buffers for ``device`` (made on first use)."""
        rows = self.by_device.get(device)
        if rows is None:
            rows = self.by_device[device] = DeviceRows(self.group_size, device)
        return rows


class DeviceRows:
    """One device's header buffers: this rank's row and the gathered table, in pinned host memory and on the device."""

    __slots__ = ("dirty", "recv", "recv_device", "recv_host", "send", "send_address", "send_device", "send_host")

    def __init__(self, group_size: int, device: torch.device) -> None:
        self.send_host = torch.empty(HEADER_WORDS, dtype=torch.int64, pin_memory=True)
        self.recv_host = torch.empty(group_size * HEADER_WORDS, dtype=torch.int64, pin_memory=True)
        self.send_address = self.send_host.data_ptr()
        self.send = _host_bytes(self.send_host)
        self.recv = _host_bytes(self.recv_host)
        self.send_device = torch.empty(HEADER_WORDS, dtype=torch.int64, device=device)
        self.recv_device = torch.empty(group_size * HEADER_WORDS, dtype=torch.int64, device=device)
        self.dirty = INLINE_BYTES  # pinned memory starts with whatever it held: zero the whole inline part once


def _host_bytes(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a CPU tensor's bytes (no copy; the tensor must outlive it)."""
    return memoryview((ctypes.c_ubyte * tensor.nbytes).from_address(tensor.data_ptr())).cast("B")


class Exchange:
    """Result of one header exchange: every rank's view, plus a copy of each row's inline payload.

    Built from the received table and independent of it afterwards (the table is reused).
    """

    def __init__(self, raw: bytearray | memoryview, group_size: int) -> None:
        unpack, from_words = _FIXED.unpack_from, View.from_words
        self.views = [from_words(unpack(raw, r * HEADER_BYTES)) for r in range(group_size)]
        self._inline: dict[int, bytes] = {}
        for rank, view in enumerate(self.views):
            if view.inline > 0:  # usually src's row alone
                start = rank * HEADER_BYTES + FIXED_BYTES
                self._inline[rank] = bytes(raw[start : start + min(view.inline, INLINE_BYTES)])

    @classmethod
    def of(cls, views: list[View], inline: dict[int, bytes]) -> Exchange:
        """An exchange from views and inline payloads known otherwise (the digest path: :mod:`._digest`)."""
        made = cls.__new__(cls)
        made.views, made._inline = views, inline
        return made

    def inline_bytes(self, rank: int) -> bytes:
        """The inline bytes in ``rank``'s row (the row says how many are valid)."""
        return self._inline.get(rank, b"")

    def copy_inline_into(self, rank: int, out: torch.Tensor) -> bool:
        """Copy ``rank``'s inline bytes into ``out`` if it is a CPU contiguous tensor of exactly that size.

        One memmove: on the hot path of a small broadcast, torch's copy costs several times more.
        Returns False, copying nothing, for any other ``out`` (the caller copies with torch).
        """
        data = self._inline.get(rank, b"")
        plain = out.is_cpu and out.is_contiguous() and not (out.is_conj() or out.is_neg())
        if _bump_version is None or not plain or out.nbytes != len(data):
            return False
        if data:
            ctypes.memmove(out.data_ptr(), data, len(data))
            _bump_version(out)  # as an in-place torch copy would: autograd sees the write
        return True

    def inline_payload(self, rank: int) -> torch.Tensor:
        """The inline bytes in ``rank``'s row as a new CPU uint8 tensor."""
        data = self._inline.get(rank, b"")
        if not data:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def exchange(
    words: list[int],
    *,
    group: Any,
    group_size: int,
    device: torch.device,
    inline: torch.Tensor | bytes | None = None,
    wait_for: timedelta | None = None,
    scratch: Scratch | GatherScratch | None = None,
) -> Exchange:
    """Send this rank's header row (``words`` plus optional inline payload) to every rank.

    ``inline``: bytes, or a tensor whose raw bytes (``nbytes`` of them, any dtype) are sent.
    ``scratch``: the group's reusable buffers (:class:`Scratch` on CPU, :class:`GatherScratch` on CUDA).
    ``wait_for``: how long to wait for the exchange (None: the process-group timeout).

    A group of one rank runs no collective: its own row is the whole table. On CPU (gloo), one
    ``all_to_all_single`` of ``group_size`` copies of the row; on CUDA (NCCL), one all_gather of the row
    (see :func:`_gathers`). Either way rank ``r``'s row lands in row ``r`` of every rank's table, and
    every buffer's size follows from the group size alone. Rows are built in a ``bytearray`` (no per-word
    torch ops: this is the hot path of a small call).

    Raises:
        CollectiveFailed: the exchange timed out or a peer failed.
    """
    if group_size == 1:
        row = bytearray(HEADER_BYTES)
        _fill_row(row, address_of(row), 0, words, inline)
        return Exchange(row, 1)
    if _gathers(device):
        held_rows = scratch if isinstance(scratch, GatherScratch) and scratch.take() else None
        if held_rows is not None:
            return gather_rows(words, group=group, device=device, inline=inline, wait_for=wait_for, scratch=held_rows)
        return _gather_fresh(words, group=group, group_size=group_size, device=device, inline=inline, wait_for=wait_for)
    total = group_size * HEADER_BYTES
    held = scratch if isinstance(scratch, Scratch) and scratch.take() else None
    if held is not None:
        send, send_t, recv, recv_t = held.buffer, held.tensor, held.recv, held.recv_tensor
        held.dirty = _fill_row(send, held.address, held.dirty, words, inline)
    else:
        send, recv = bytearray(total), bytearray(total)
        send_t, recv_t = torch.frombuffer(send, dtype=torch.int64), torch.frombuffer(recv, dtype=torch.int64)
        _fill_row(send, address_of(send), 0, words, inline)
    for r in range(1, group_size):
        send[r * HEADER_BYTES : (r + 1) * HEADER_BYTES] = send[:HEADER_BYTES]
    wait(_all_to_all(recv_t, send_t, group), wait_for)  # on failure the scratch stays taken: gloo may hold it
    exchanged = Exchange(recv, group_size)
    if held is not None:
        held.give_back()
    return exchanged


def _gather_fresh(
    words: list[int],
    *,
    group: Any,
    group_size: int,
    device: torch.device,
    inline: torch.Tensor | bytes | None,
    wait_for: timedelta | None,
) -> Exchange:
    """The all_gather of header rows through buffers made for this call (another thread holds the scratch)."""
    total = group_size * HEADER_BYTES
    recv = bytearray(total)
    recv_t = torch.frombuffer(recv, dtype=torch.int64)
    send = bytearray(HEADER_BYTES)
    _fill_row(send, address_of(send), 0, words, inline)
    row = torch.frombuffer(send, dtype=torch.int64)
    out = recv_t if device.type == "cpu" else torch.empty(total // 8, dtype=torch.int64, device=device)
    wait(_all_gather_single(out, row.to(device), group), wait_for)
    if out is not recv_t:
        recv_t.copy_(out)
    return Exchange(recv, group_size)


def gather_rows(
    words: list[int],
    *,
    group: Any,
    device: torch.device,
    inline: torch.Tensor | bytes | None,
    wait_for: timedelta | None,
    scratch: GatherScratch,
) -> Exchange:
    """The all_gather of header rows through the group's reused buffers on ``device`` (``scratch`` taken).

    The row is written into pinned host memory, copied to the device by DMA, gathered, and the table
    copied back into pinned host memory by DMA (a blocking copy: the table is complete when it returns);
    no buffer is allocated after the group's first call on the device.
    """
    rows = scratch.on(device)
    rows.dirty = _fill_row(rows.send, rows.send_address, rows.dirty, words, inline)
    rows.send_device.copy_(rows.send_host, non_blocking=True)
    wait(_all_gather_single(rows.recv_device, rows.send_device, group), wait_for)  # on failure: stays taken
    rows.recv_host.copy_(rows.recv_device)
    exchanged = Exchange(rows.recv, scratch.group_size)
    scratch.give_back()
    return exchanged


def _fill_row(
    send: bytearray | memoryview, address: int, dirty: int, words: list[int], inline: torch.Tensor | bytes | None
) -> int:
    """Write the fixed words and inline payload into row 0 of ``send``; returns the inline length.

    Inline bytes a previous call left beyond this payload (``dirty`` of them) are zeroed, so a row
    never carries stale data.
    """
    _FIXED.pack_into(send, 0, *words)
    length = put_inline(send, address, FIXED_BYTES, inline)
    if dirty > length:
        send[FIXED_BYTES + length : FIXED_BYTES + dirty] = bytes(dirty - length)
    return length


def put_inline(buf: bytearray | memoryview, address: int, offset: int, inline: torch.Tensor | bytes | None) -> int:
    """Copy an inline payload (bytes, or a tensor's raw bytes) into ``buf`` at ``offset``; returns its length.

    ``address`` is that of ``buf`` (:func:`address_of`); the caller checked that the payload fits.
    """
    if isinstance(inline, torch.Tensor):
        if not (inline.is_cpu and inline.is_contiguous()) or inline.is_conj() or inline.is_neg():
            inline = inline.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
        length = inline.nbytes
        if length:
            ctypes.memmove(address + offset, inline.data_ptr(), length)
        return int(length)
    if inline:
        buf[offset : offset + len(inline)] = inline
        return len(inline)
    return 0


#: Exchange header rows with an all_gather on CPU (gloo) too. Off: gloo's all-to-all is 2-4x cheaper at small
#: worlds (docs/broadcast.md, "Why the header is an all-to-all"). Tests turn it on to run the gather path.
ALL_GATHER_ON_CPU = False


def _gathers(device: torch.device) -> bool:
    """Whether the header rows travel by all_gather (a ring) rather than all-to-all.

    Every rank of a group decides alike: the communication device follows from the group's backend.
    On CUDA (NCCL) an all-to-all would open point-to-point connections, with their buffers, to every
    peer of the group on the first call, which grows with the world; the ring all_gather NCCL uses
    for everything else needs none. On CPU (gloo) all-to-all measured fastest.
    """
    return device.type != "cpu" or ALL_GATHER_ON_CPU


def address_of(buf: bytearray) -> int:
    """The address of a bytearray's memory (valid while it is not resized; ours never are)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


_bump_version: Any = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)


def _all_to_all(out: torch.Tensor, inp: torch.Tensor, group: Any) -> Any:
    """Start an even all-to-all; straight on the ProcessGroup when it offers ``alltoall_base``.

    That is what ``dist.all_to_all_single`` calls after its argument checks (~6 µs a call, a tenth of
    a small broadcast); our buffers are built here, so the checks cannot fail. Falls back to the
    public function for groups without the method.
    """
    direct = getattr(group, "alltoall_base", None)
    if direct is not None:
        return direct(out, inp, [], [])
    return dist.all_to_all_single(out, inp, group=group, async_op=True)


def exchange_blobs(
    blob: torch.Tensor, *, width: int, group_size: int, group: Any, device: torch.device, wait_for: timedelta | None
) -> list[torch.Tensor]:
    """All-gather one uint8 blob per rank into rows of ``width`` bytes (diagnostics).

    Every rank must pass the same ``width`` (decided from facts every rank holds), so the buffers
    gloo compares have equal sizes; a blob longer than ``width`` is cut to it, and a shorter one padded
    with zeros. Row ``r`` of the result is rank ``r``'s (cut or padded) blob.
    """
    width = max(1, width)
    padded = torch.zeros(width, dtype=torch.uint8)
    length = min(blob.numel(), width)
    padded[:length].copy_(blob[:length])
    table = torch.empty(group_size * width, dtype=torch.uint8, device=device)
    wait(_all_gather_single(table, padded.to(device), group), wait_for)
    rows = table.view(group_size, width).cpu()
    return [rows[r] for r in range(group_size)]


def _all_gather_single(out: torch.Tensor, row: torch.Tensor, group: Any) -> Any:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
    return gather(out, row, group=group, async_op=True)


class CollectiveFailed(Exception):
    """A header or payload collective failed: timed out, or a peer died (gloo's RuntimeError)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def wait(work: Any, wait_for: timedelta | None) -> None:
    """Wait for an async collective, bounded by ``wait_for`` when given.

    Raises:
        CollectiveFailed: the collective did not complete in time, or failed (a peer crashed); the
            group is unusable afterwards.
    """
    try:
        done = work.wait() if wait_for is None else work.wait(timeout=wait_for)
    except RuntimeError as exc:  # gloo reports timeouts and dead peers as RuntimeError
        text = str(exc)
        raise CollectiveFailed(text, timed_out="timed out" in text.lower()) from exc
    if done is False:
        limit = f"{wait_for.total_seconds()} s" if wait_for is not None else "the process-group timeout"
        raise CollectiveFailed(f"collective not complete after {limit}", timed_out=True)
