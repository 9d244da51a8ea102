"""The fixed-size int64 header every rank contributes to each call, and its exchange.

One all_gather of a ``[HEADER_WORDS]`` int64 row per rank gives every rank every rank's view of
the call, so all ranks reach the same verdict from the same facts. The row is the same size for
every call kind, so ranks that disagree on *which* call they make still exchange equal-sized
buffers: gloo aborts the process (SIGABRT) when sizes differ, which is the failure we exist to
prevent. Small payloads (up to :data:`INLINE_BYTES`) ride inside src's row, so a small broadcast
costs one collective instead of two.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

MAGIC = 0x64697374_62630001  # "distbc" + protocol version 1
MAX_NDIM = 12
FIXED_WORDS = 32
INLINE_BYTES = 4096
"""Payloads up to this many bytes ride inside the header collective (one collective per call).

A protocol constant rather than a per-call option: ranks that disagreed on it would exchange
differently sized rows, which gloo answers with SIGABRT.
"""
HEADER_WORDS = FIXED_WORDS + INLINE_BYTES // 8

# Word offsets in a row.
W_MAGIC, W_SEQ, W_OP, W_SRC, W_HAS_BUFFER, W_STATUS, W_DTYPE, W_DEVICE, W_NDIM = range(9)
W_SHAPE = 9  # MAX_NDIM words
W_NBYTES = W_SHAPE + MAX_NDIM  # 21
W_FINGERPRINT = 22
W_COUNT = 23
W_AUX_NBYTES = 24
W_INLINE = 25
W_GLOBAL_RANK = 26

OP_TENSOR, OP_OBJECT, OP_STATE_DICT, OP_MODULE = 1, 2, 3, 4
OP_NAMES = {OP_TENSOR: "broadcast_tensor", OP_OBJECT: "broadcast_object", OP_STATE_DICT: "broadcast_state_dict",
            OP_MODULE: "broadcast_module"}  # fmt: skip

NOT_INLINE = -1


@dataclasses.dataclass(frozen=True)
class View:
    """One rank's view of a call: the fixed words of its header row, decoded."""

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

    @classmethod
    def from_words(cls, words: Sequence[int]) -> View:
        """Decode the first :data:`FIXED_WORDS` words of a row (garbage-tolerant: never raises)."""
        ndim = int(words[W_NDIM])
        dims = tuple(int(d) for d in words[W_SHAPE : W_SHAPE + max(0, min(ndim, MAX_NDIM))])
        return cls(
            magic=int(words[W_MAGIC]),
            seq=int(words[W_SEQ]),
            op=int(words[W_OP]),
            src=int(words[W_SRC]),
            has_buffer=bool(words[W_HAS_BUFFER]),
            status=int(words[W_STATUS]),
            dtype=int(words[W_DTYPE]),
            device=int(words[W_DEVICE]),
            ndim=ndim,
            shape=dims,
            nbytes=int(words[W_NBYTES]),
            fingerprint=int(words[W_FINGERPRINT]),
            count=int(words[W_COUNT]),
            aux_nbytes=int(words[W_AUX_NBYTES]),
            inline=int(words[W_INLINE]),
            global_rank=int(words[W_GLOBAL_RANK]),
        )


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
) -> list[int]:
    """The :data:`FIXED_WORDS` words of this rank's row (``shape=None``: no tensor view, ndim -1)."""
    words = [0] * FIXED_WORDS
    words[W_MAGIC] = MAGIC
    words[W_SEQ] = seq
    words[W_OP] = op
    words[W_SRC] = src
    words[W_HAS_BUFFER] = int(has_buffer)
    words[W_STATUS] = status
    words[W_DTYPE] = dtype
    words[W_DEVICE] = device
    if shape is None:
        words[W_NDIM] = -1
    else:
        words[W_NDIM] = len(shape)
        words[W_SHAPE : W_SHAPE + len(shape)] = list(shape)
    words[W_NBYTES] = nbytes
    words[W_FINGERPRINT] = fingerprint
    words[W_COUNT] = count
    words[W_AUX_NBYTES] = aux_nbytes
    words[W_INLINE] = inline
    words[W_GLOBAL_RANK] = global_rank
    return words


class SequenceCounter:
    """Per-group call counter: the ``#12`` in messages, and how a skipped call is detected.

    Process-wide by nature (torch keeps the same per group); keyed weakly by the group object so a
    destroyed group's count goes with it.
    """

    def __init__(self) -> None:
        self._counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def next(self, group: Any) -> int:
        """Increment and return the count for ``group`` (first call: 1)."""
        count = self._counts.get(group, 0) + 1
        self._counts[group] = count
        return count


SEQUENCE = SequenceCounter()


class Exchange:
    """Result of one header all_gather: every rank's view, plus the inline payload of any row."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table  # [group_size, HEADER_WORDS] int64 on CPU
        self.views = [View.from_words(row) for row in table[:, :FIXED_WORDS].tolist()]

    def inline_payload(self, rank: int) -> torch.Tensor:
        """The inline bytes in ``rank``'s row (a uint8 view; the row says how many are valid)."""
        length = max(0, min(self.views[rank].inline, INLINE_BYTES))
        return self.table[rank, FIXED_WORDS:].view(torch.uint8)[:length]


def exchange(
    words: list[int],
    *,
    group: Any,
    group_size: int,
    device: torch.device,
    inline: torch.Tensor | None = None,
    timeout: float | None = None,
) -> Exchange:
    """All-gather this rank's header row (``words`` plus optional inline uint8 payload).

    Raises:
        CollectiveFailed: the exchange timed out or a peer failed.
    """
    row = torch.zeros(HEADER_WORDS, dtype=torch.int64)
    row[:FIXED_WORDS] = torch.tensor(words, dtype=torch.int64)
    if inline is not None and inline.numel():
        row[FIXED_WORDS:].view(torch.uint8)[: inline.numel()].copy_(inline)
    row = row.to(device)
    table = torch.empty(group_size * HEADER_WORDS, dtype=torch.int64, device=device)
    wait(_all_gather_single(table, row, group), timeout)
    return Exchange(table.view(group_size, HEADER_WORDS).cpu())


def exchange_blobs(
    blob: torch.Tensor, lengths: Sequence[int], *, group: Any, device: torch.device, timeout: float | None
) -> list[torch.Tensor]:
    """All-gather variable-length uint8 blobs whose lengths every rank already knows (diagnostics)."""
    width = max(1, *lengths)
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[: blob.numel()].copy_(blob)
    table = torch.empty(len(lengths) * width, dtype=torch.uint8, device=device)
    wait(_all_gather_single(table, padded.to(device), group), timeout)
    rows = table.view(len(lengths), width).cpu()
    return [rows[r, : lengths[r]] for r in range(len(lengths))]


def _all_gather_single(out: torch.Tensor, row: torch.Tensor, group: Any) -> Any:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
    return gather(out, row, group=group, async_op=True)


class CollectiveFailed(Exception):
    """A header or payload collective failed: timed out, or a peer died (gloo's RuntimeError)."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def wait(work: Any, timeout: float | None) -> None:
    """Wait for an async collective, bounded by ``timeout`` seconds when given.

    Raises:
        CollectiveFailed: the collective did not complete in time, or failed (a peer crashed); the
            group is unusable afterwards.
    """
    try:
        done = work.wait() if timeout is None else work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as exc:  # gloo reports timeouts and dead peers as RuntimeError
        text = str(exc)
        raise CollectiveFailed(text, timed_out="timed out" in text.lower()) from exc
    if done is False:
        raise CollectiveFailed(f"collective not complete after {timeout} s", timed_out=True)
