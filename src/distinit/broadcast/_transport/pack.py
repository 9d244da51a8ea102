"""Moving bytes: uint8 wire views, staging copies, the packed layout of a segment or file, status exchanges.

What every transport shares: the network path (a verified call's buffers broadcast in place or through a
staging copy, each wait bounded), and the shm and file transports (each tensor at a 64-byte aligned slot of
one packed region, unpacked into buffers or views, the small status exchanges between their steps and the
error they raise together when a step failed on some ranks).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from distinit._foreign import first_line
from distinit._torch import foreach_copy, peer
from distinit.broadcast import _header
from distinit.broadcast._group import CallContext
from distinit.broadcast._mismatch import rank_error, ranks_phrase, timeout_error
from distinit.errors import BroadcastMismatchError

ALIGN = 64
"""Each tensor starts on a 64-byte boundary of a segment or file (any dtype's alignment, one cache line)."""


VIAS = {"network": 0, "auto": 1, "shm": 2, "file": 3}
"""``via=`` values and their codes in the header's flags word (0: the default, so old rows read as network)."""
VIA_SHIFT = 8
"""The flags word's bits 8-11 carry the code; bit 0 is ``FLAG_FLAT``, bit 1 ``FLAG_ZERO_COPY``."""


@dataclasses.dataclass(frozen=True)
class Via:
    """One rank's transport choice, checked on entry."""

    name: str
    path: str | None = None
    zero_copy: bool = False
    keep: bool = False

    @property
    def flags(self) -> int:
        """The header flag bits announcing this choice (and whether this rank asked for ``zero_copy``)."""
        return VIAS[self.name] << VIA_SHIFT | (_header.FLAG_ZERO_COPY if self.zero_copy else 0)


@dataclasses.dataclass(frozen=True)
class Route:
    """How one call moves its payload: the same on every rank.

    ``hosts``: each host's group ranks, its leader first (src on its own host; else the lowest rank);
    src's host comes first. ``token``: src's random hex, part of every segment and file name.
    """

    kind: str  # "network", "shm" or "file"
    hosts: tuple[tuple[int, ...], ...]
    token: str
    note: str = ""

    def host_of(self, rank: int) -> int:
        """The index of ``rank``'s host in :attr:`hosts`."""
        return next(i for i, ranks in enumerate(self.hosts) if rank in ranks)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy); any dtype, including 0-d and empty."""
    return tensor.reshape(-1).view(torch.uint8)


def to_bytes(data: torch.Tensor) -> bytes:
    """Python bytes from a CPU uint8 tensor, in one copy (no numpy needed)."""
    out = bytearray(data.numel())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(data)
    return bytes(out)


def from_bytes(data: bytes) -> torch.Tensor:
    """A CPU uint8 tensor holding ``data`` (a copy; torch.frombuffer needs a writable buffer)."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def wire_view(tensor: torch.Tensor, comm_device: torch.device) -> tuple[torch.Tensor, bool]:
    """The uint8 tensor to put on the wire for ``tensor``, and whether it is a staging copy.

    In place (zero copy) when the tensor is contiguous and already on ``comm_device``; otherwise a
    contiguous copy there (gloo with CUDA tensors, non-contiguous tensors).
    """
    if tensor.device == comm_device and tensor.is_contiguous() and not is_lazy(tensor):
        return as_bytes(tensor), False
    plain = tensor.detach().resolve_conj().resolve_neg()
    if plain.is_cuda and comm_device.type == "cpu":  # device -> host by DMA into pinned (page-locked) memory
        staged = host_buffer(plain.nbytes, pinned=True)
        staged.copy_(as_bytes(plain.contiguous()))
        return staged, True
    return as_bytes(plain.to(comm_device).contiguous()), True


def host_buffer(nbytes: int, *, pinned: bool) -> torch.Tensor:
    """A CPU uint8 staging buffer; ``pinned`` for one end of a CUDA copy.

    Pinned memory is copied by DMA, and torch's caching host allocator keeps freed pinned blocks for
    the next call: measured on an H100 with gloo, a 64 MB CUDA broadcast staged through pageable memory
    spent most of its time in page faults and the driver's own bounce copies.
    """
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and torch.cuda.is_available())


def is_lazy(tensor: torch.Tensor) -> bool:
    """A conjugate or negative view: its memory holds other values than it reads as."""
    return tensor.is_conj() or tensor.is_neg()


def receive_view(ctx: CallContext, out: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The uint8 tensor to receive into for ``out``, and whether it must be copied back afterwards.

    ``out`` itself when the collective device can write it in place; else a staging buffer there (pinned host
    memory for a CUDA ``out`` on gloo), from :func:`allocate`.
    """
    comm_device = ctx.comm_device
    if out.device == comm_device and out.is_contiguous() and not is_lazy(out):
        return as_bytes(out), False
    nbytes = out.numel() * out.element_size()
    return allocate(ctx, (nbytes,), dtype=torch.uint8, device=comm_device, pinned=out.is_cuda), True


def allocate(
    ctx: CallContext, shape: Sequence[int], *, dtype: torch.dtype, device: torch.device | str, pinned: bool = False
) -> torch.Tensor:
    """The one allocator of receive buffers: ``torch.empty`` for what src announced, failing as a broadcast error.

    Every receive buffer of every call goes through here (a tensor or state dict a receiver did not pass,
    staging for a buffer the collective cannot write in place, an object's or metadata's bytes off a device,
    a transport's unpacked tensors), on CPU or CUDA, at most once per tensor of a call: the route is known
    before anything is allocated. ``pinned``: page-locked host memory for one end of a CUDA copy (when CUDA
    is there; see :func:`host_buffer`). Sizes are within the verified header's bounds.

    Raises:
        BroadcastMismatchError: ``field="size"``, on this rank only: the memory is not there.
    """
    try:
        if pinned and torch.cuda.is_available() and torch.device(device).type == "cpu":
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        return torch.empty(shape, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as exc:  # torch reports an allocation failure as a RuntimeError
        nbytes = math.prod(shape) * dtype.itemsize
        raise rank_error(
            ctx,
            f"rank {ctx.rank} cannot allocate the {nbytes} bytes src announced on {device}: {first_line(exc)}",
            field="size",
            view=f"cannot allocate {nbytes} bytes",
            at_fault=(ctx.rank,),
            why="src sends more than this rank has memory for (its peers will time out waiting for it)",
            fix="pass a preallocated buffer, free memory on this rank, or check what src sends",
        ) from exc


def copy_back(out: torch.Tensor, staged: torch.Tensor) -> None:
    """Copy received bytes from a staging buffer into ``out`` (any device, any layout)."""
    with torch.no_grad():
        if out.is_contiguous() and not is_lazy(out):
            as_bytes(out).copy_(staged)  # a byte copy: bit-exact for every dtype, even odd bool bytes
        else:  # non-contiguous, or a conjugate/negative view: copy values, which torch maps through the view
            out.copy_(staged.view(out.dtype).view(out.shape))


def copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy ``src[i]`` into ``dst[i]`` in one kernel where torch has one (a no-op for a tensor onto itself)."""
    foreach_copy(dst, src)


def broadcast_bytes(buf: torch.Tensor, ctx: CallContext) -> Any:
    """Start an async broadcast of a uint8 buffer from the call's src; returns the work handle."""
    return dist.broadcast(buf, group=ctx.group, async_op=True, **peer("broadcast", "src", ctx.src, ctx.group))


def wait_or_raise(work: Any, ctx: CallContext, phase: str) -> None:
    """Wait for ``work`` within the call's timeout; map failure to :class:`BroadcastTimeoutError`."""
    try:
        _header.wait(work, ctx.wait_for)
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, phase, exc) from exc


def sync(ctx: CallContext, status: int, phase: str) -> list[int]:
    """Every rank's status word (one all_gather): a barrier that also tells each rank how the others fared.

    Raises:
        BroadcastTimeoutError: a peer died or the exchange timed out (``phase`` names the step).
    """
    return [row[0] for row in sync_words(ctx, [status], phase)]


def sync_words(ctx: CallContext, words: list[int], phase: str) -> list[list[int]]:
    """Every rank's row of int64 words (one all_gather; every rank passes as many): :func:`sync` with more facts.

    Raises:
        BroadcastTimeoutError: a peer died or the exchange timed out (``phase`` names the step).
    """
    row = torch.tensor(words, dtype=torch.int64).view(torch.uint8)
    try:
        blobs = _header.exchange_blobs(
            row, width=8 * len(words), group_size=ctx.size, group=ctx.group, device=ctx.comm_device,
            wait_for=ctx.wait_for,
        )  # fmt: skip
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, phase, exc) from exc
    return [b.view(torch.int64).tolist() for b in blobs]


Spec = list[tuple[torch.dtype, tuple[int, ...]]]
"""The tensors of a call, in order: dtype and shape (checked by the verdict, the same on every rank)."""


def slots(spec: Spec) -> tuple[list[int], int]:
    """Each tensor's byte offset in a segment or file (64-byte aligned) and the total size."""
    offsets, end = [], 0
    for dtype, shape in spec:
        offsets.append(end)
        nbytes = dtype.itemsize * _numel(shape)
        end += -(-nbytes // ALIGN) * ALIGN if nbytes else 0
    return offsets, end


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def nbytes_of(dtype: torch.dtype, shape: Sequence[int]) -> int:
    """A tensor's payload size in bytes."""
    return dtype.itemsize * _numel(shape)


def transport_error(
    ctx: CallContext, bad: dict[int, str], *, step: str, why: str, fix: str, field: str = "transport"
) -> BroadcastMismatchError:
    """The error when a transport step failed on some ranks, built from facts every rank holds (identical).

    ``bad`` maps each failing rank to what it saw; ``step`` names the transport step, e.g. "shared memory".
    """
    by_text: dict[str, list[int]] = {}
    for rank in sorted(bad):
        by_text.setdefault(bad[rank], []).append(rank)
    body = "; ".join(f"{ranks_phrase(ranks)} {text}" for text, ranks in by_text.items())
    return BroadcastMismatchError(
        f"{ctx.call} call #{ctx.seq} (src={ctx.src}, {ctx.size} ranks): {step} failed: {body}. "
        f"Raised on all {ctx.size} ranks; no rank returned data from this call.",
        call=ctx.call,
        seq=ctx.seq,
        field=field,
        src=ctx.src,
        views=dict(bad),
        ranks=tuple(sorted(bad)),
        why=why,
        fix=fix,
    )


def unpack(
    ctx: CallContext,
    data: torch.Tensor,
    spec: Spec,
    offsets: list[int],
    outs: list[torch.Tensor | None],
    *,
    zero_copy: bool,
) -> list[torch.Tensor]:
    """This rank's tensors from the packed bytes: buffers filled, new tensors allocated, or views of ``data``."""
    result = []
    for (dtype, shape), offset, out in zip(spec, offsets, outs, strict=True):
        nbytes = nbytes_of(dtype, shape)
        piece = data[offset : offset + nbytes]
        if out is None and zero_copy and nbytes:
            result.append(piece.view(dtype).view(shape))
            continue
        if out is None:
            out = allocate(ctx, shape, dtype=dtype, device="cpu")
        if nbytes:
            copy_back(out, piece)
        result.append(out)
    return result


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a CPU contiguous uint8 tensor's bytes (no copy; the tensor must outlive it)."""
    n = tensor.numel()
    if not n:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * n).from_address(tensor.data_ptr())).cast("B")
