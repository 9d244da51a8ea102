"""The header at large group sizes: one reduction of a fixed digest instead of every rank's row to every rank.

The row exchange (:func:`distinit.broadcast._header.exchange`) hands every rank every rank's row, so each
rank moves ``N x 4,352 B`` per call: 4.4 MB at 1,000 ranks. From :func:`digest_from` ranks on, each rank
instead adds its row to ONE reduction (MAX) of :data:`DIGEST_WORDS` int64 words (an all_reduce on NCCL; on
gloo, whose all_reduce is a ring, a binomial tree of sends and a broadcast: :func:`tree_max`), whose size is a
protocol constant (so ranks that disagree on everything still reduce equal-sized buffers: gloo aborts on a size
mismatch). The layout makes the reduced vector hold, for every fixed header word, its maximum *and* its
minimum over the ranks that must agree on it (``~w`` reverses the order of int64 and, unlike ``-w``, never
overflows), the minimum of three per-rank words (has a buffer, flattened, ``max_bytes``), the maximum and
minimum of the flag bits every rank must share (all but the flattened bit: the payload transport), and src's inline
payload (every other rank adds INT64_MIN there, the identity of MAX). The digest is exact: it is the words
themselves, not a hash, so no two different rows can look alike.

Equal maximum and minimum for every word means the ranks agree, and every rank then holds src's row (and a
small payload) from the one reduction. Anything else, and the call falls back once to the full row exchange
and its verdict (:func:`distinit.broadcast._mismatch.judge`): the error, the ranks it names and its wording
are the row path's, on every rank. Every rank reaches the same decision from the same reduced vector.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import struct
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distinit._torch import peer
from distinit.broadcast import _header
from distinit.broadcast._bounds import PROBLEM_OF_OP
from distinit.broadcast._header import (
    FIXED_WORDS,
    FLAG_FLAT,
    FLAG_ZERO_COPY,
    INLINE_BYTES,
    MAGIC,
    MAX_NDIM,
    OP_MODULE,
    OP_OBJECT,
    OP_STATE_DICT,
    OP_TENSOR,
    W_COUNT,
    W_DEVICE,
    W_DTYPE,
    W_FINGERPRINT,
    W_FLAGS,
    W_HAS_BUFFER,
    W_LIMIT,
    W_MAGIC,
    W_NBYTES,
    W_NDIM,
    W_OP,
    W_SEQ,
    W_SHAPE,
    W_SRC,
    W_STATUS,
    Exchange,
    View,
)

DIGEST_FROM = 64
"""Groups of this many ranks or more agree through the digest; smaller ones exchange rows.

Decided from the group size alone, so every rank of a group takes the same path. Why 64: see
docs/scale.md, "broadcast: the header exchange" (the row exchange costs every rank N messages and
N x 4,352 B; from about 64 ranks that is 10x what a small broadcast costs).
"""

DIGEST_FROM_ENV = "DISTINIT_BROADCAST_DIGEST_FROM"
"""Environment variable that overrides :data:`DIGEST_FROM`; it must be the same on every rank."""

INT64_MIN = -(1 << 63)

# Word offsets in the digest vector.
A_HAS_BUFFER = 2 * FIXED_WORDS  # ~has_buffer: its MAX is ~(min over ranks), i.e. "every rank has a buffer"
A_FLAT = A_HAS_BUFFER + 1  # ~(FLAG_FLAT set): "every rank's module is flattened"
A_LIMIT = A_FLAT + 1  # ~limit: the smallest max_bytes of the group
A_SHARED_FLAGS = A_LIMIT + 1  # the flag bits every rank must share (all but FLAG_FLAT/FLAG_ZERO_COPY: transport)...
A_SHARED_FLAGS_LOW = A_SHARED_FLAGS + 1  # ...and their complement: maximum and minimum, as for the fixed words
A_ZERO_COPY = A_SHARED_FLAGS_LOW + 1  # FLAG_ZERO_COPY set (1/0): its MAX is "some rank asked for zero_copy"
W_PAYLOAD = A_ZERO_COPY + 1  # src's inline payload, INLINE_BYTES of it
DIGEST_WORDS = W_PAYLOAD + INLINE_BYTES // 8
DIGEST_BYTES = DIGEST_WORDS * 8

_HEAD = struct.Struct(f"={W_PAYLOAD}q")  # native byte order, as the int64 tensor holds it
_NO_PAYLOAD = struct.pack("=q", INT64_MIN) * (INLINE_BYTES // 8)

_EVERY_RANK = (W_MAGIC, W_SEQ, W_OP, W_SRC, W_STATUS)
"""Words every rank must agree on, whatever it passed."""

_SHARED = {OP_OBJECT: (*_EVERY_RANK, W_FINGERPRINT)}  # every rank fingerprints its type=
"""Words every rank adds, by call kind (default: :data:`_EVERY_RANK`)."""

_HOLDER = {
    OP_TENSOR: (W_DEVICE, W_DTYPE, W_NDIM, *range(W_SHAPE, W_SHAPE + MAX_NDIM), W_NBYTES),
    OP_STATE_DICT: (W_FINGERPRINT, W_COUNT),
    OP_MODULE: (W_FINGERPRINT, W_COUNT),
}
"""Words a receiver adds when it passed a buffer (they must then equal src's), by call kind."""

_DIGEST_FROM_TEXT = re.compile(r"[0-9]{1,10}")


@functools.lru_cache(maxsize=1)
def digest_from() -> int:
    """:data:`DIGEST_FROM_ENV`, else :data:`DIGEST_FROM`; read once per process (tests clear the cache).

    Raises:
        ValueError: the variable is not a whole number of ranks from 1 to 2**31 (raised again on every
            call, on every rank, before any collective).
    """
    text = os.environ.get(DIGEST_FROM_ENV)
    if text is None:
        return DIGEST_FROM
    value = int(text) if _DIGEST_FROM_TEXT.fullmatch(text) else 0
    if not 1 <= value <= 1 << 31:
        raise ValueError(
            f"{DIGEST_FROM_ENV}={text!r} must be a whole number of ranks from 1 to 2**31 (groups of that many "
            f"ranks or more check broadcast headers through one all_reduce); unset it to use {DIGEST_FROM}, "
            "and set the same value on every rank"
        )
    return value


@functools.cache
def _mask(op: int, role: int) -> tuple[bool, ...]:
    """Which fixed words a rank adds: ``role`` 0 is src (every word), 1 a receiver with a buffer, 2 one without."""
    if role == 0:
        return (True,) * FIXED_WORDS
    words = set(_SHARED.get(op, _EVERY_RANK)) | (set(_HOLDER.get(op, ())) if role == 1 else set())
    return tuple(i in words for i in range(FIXED_WORDS))


def contribution(words: list[int], *, rank: int, inline: torch.Tensor | bytes | None) -> bytearray:
    """This rank's :data:`DIGEST_BYTES` digest vector, before the reduction.

    Src (the rank its own row names) adds every word and its inline payload; a receiver adds the words
    it must agree on (:data:`_SHARED`, and :data:`_HOLDER` when it passed a buffer) and INT64_MIN, the
    identity of MAX, elsewhere.
    """
    is_src = words[W_SRC] == rank
    mask = _mask(words[W_OP], 0 if is_src else 1 if words[W_HAS_BUFFER] else 2)
    high = [w if m else INT64_MIN for w, m in zip(words, mask, strict=True)]
    low = [~w if m else INT64_MIN for w, m in zip(words, mask, strict=True)]
    flags = words[W_FLAGS]
    flat, zero_copy = (1 if flags & FLAG_FLAT else 0), (1 if flags & FLAG_ZERO_COPY else 0)
    shared = flags & ~(FLAG_FLAT | FLAG_ZERO_COPY)
    buf = bytearray(DIGEST_BYTES)
    has_buffer = 1 if words[W_HAS_BUFFER] else 0
    _HEAD.pack_into(buf, 0, *high, *low, ~has_buffer, ~flat, ~words[W_LIMIT], shared, ~shared, zero_copy)
    if is_src:
        _header.put_inline(buf, _header.address_of(buf), W_PAYLOAD * 8, inline)
    else:
        buf[W_PAYLOAD * 8 :] = _NO_PAYLOAD
    return buf


def decode(reduced: bytes | bytearray, group_size: int) -> Exchange | None:
    """The call's exchange when the reduced vector says every rank agrees; None when the rows must be compared.

    Agreement: every fixed word has one value (maximum equals minimum), src is in the group, no rank
    reported a problem, src's row is well formed for its call kind and, for an object, within every
    rank's ``max_bytes``, and every rank sets the same flag bits but the flat and zero-copy ones. That implies
    :func:`distinit.broadcast._mismatch.agreed` on the rows themselves. The views: src's row at ``src``;
    at every other index the group's summary, src's row with ``has_buffer``, the flat flag and ``limit``
    replaced by their minimum over the group and the zero-copy flag by its maximum (what a
    receiver's own row holds beyond that is not known, and not needed once the ranks agree).
    """
    head = _HEAD.unpack_from(reduced, 0)
    row = head[:FIXED_WORDS]
    if row != tuple(~w for w in head[FIXED_WORDS : 2 * FIXED_WORDS]):
        return None
    sv = View.from_words(row)
    problem = PROBLEM_OF_OP.get(sv.op)
    if sv.magic != MAGIC or sv.status or not 0 <= sv.src < group_size or problem is None or problem(sv) is not None:
        return None
    limit, shared = ~head[A_LIMIT], head[A_SHARED_FLAGS]
    if (sv.op == OP_OBJECT and limit < sv.aux_nbytes + sv.nbytes) or shared != ~head[A_SHARED_FLAGS_LOW]:
        return None
    flags = shared | (FLAG_FLAT if ~head[A_FLAT] == 1 else 0) | (FLAG_ZERO_COPY if head[A_ZERO_COPY] == 1 else 0)
    summary = dataclasses.replace(sv, has_buffer=~head[A_HAS_BUFFER] == 1, flags=flags, limit=limit)
    views = [summary] * group_size
    views[sv.src] = sv
    inline: dict[int, bytes] = {}
    if sv.inline > 0:
        start = W_PAYLOAD * 8
        inline[sv.src] = bytes(reduced[start : start + min(sv.inline, INLINE_BYTES)])
    return Exchange.of(views, inline)


def agree(
    words: list[int],
    *,
    rank: int,
    group: Any,
    group_size: int,
    device: torch.device,
    inline: torch.Tensor | bytes | None = None,
    wait_for: timedelta | None = None,
) -> Exchange | None:
    """Reduce every rank's digest (MAX); the exchange when all agree, None to compare rows.

    Raises:
        CollectiveFailed: the reduction timed out or a peer failed.
    """
    buf = contribution(words, rank=rank, inline=inline)
    vector = torch.frombuffer(buf, dtype=torch.int64)
    if device.type == "cpu":
        tree_max(vector, group=group, rank=rank, group_size=group_size, wait_for=wait_for)
    else:
        # NCCL reduces small buffers along a tree (log2 N steps): one all_reduce is the whole agreement.
        on_device = vector.to(device)
        _header.wait(dist.all_reduce(on_device, op=dist.ReduceOp.MAX, group=group, async_op=True), wait_for)
        vector.copy_(on_device)
    return decode(buf, group_size)


TREE_TAG = 0x6462
"""The point-to-point tag of the digest's reduction steps (p2p messages match by peer and tag)."""


def tree_max(vector: torch.Tensor, *, group: Any, rank: int, group_size: int, wait_for: timedelta | None) -> None:
    """Element-wise MAX of every rank's ``vector`` into every rank's, in place, in 2 x ceil(log2 N) steps.

    Why not ``all_reduce``: gloo's is a ring whatever the size (2 x (N - 1) dependent steps; measured
    4x the row all-to-all at 16 processes, docs/scale.md). This is a binomial tree of sends toward
    group rank 0 (at step ``s``, ranks ``r`` with ``r % 2s == s`` send to ``r - s`` and are done;
    ranks with ``r % 2s == 0`` take the maximum with what ``r + s`` sends), then gloo's broadcast
    (a binomial tree too) from rank 0. Every rank sends at most one message and receives at most
    ceil(log2 N); every message is :data:`DIGEST_BYTES`, whatever the ranks passed.

    Raises:
        CollectiveFailed: a step timed out or a peer failed.
    """
    incoming = torch.empty_like(vector)
    step = 1
    while step < group_size:
        if rank % (2 * step) == step:
            to = peer("isend", "dst", rank - step, group)
            _step(functools.partial(dist.isend, vector, group=group, tag=TREE_TAG, **to), wait_for)
            break
        if rank + step < group_size:
            source = peer("irecv", "src", rank + step, group)
            _step(functools.partial(dist.irecv, incoming, group=group, tag=TREE_TAG, **source), wait_for)
            torch.maximum(vector, incoming, out=vector)
        step *= 2
    root = peer("broadcast", "src", 0, group)
    _step(functools.partial(dist.broadcast, vector, group=group, async_op=True, **root), wait_for)


def _step(start: Callable[[], Any], wait_for: timedelta | None) -> None:
    """Start one operation and wait for it; gloo's point-to-point calls can fail as they start (a peer gone).

    Raises:
        CollectiveFailed: it failed to start, failed, or did not complete in time.
    """
    try:
        work = start()
    except RuntimeError as exc:
        raise _header.CollectiveFailed(str(exc), timed_out="timed out" in str(exc).lower()) from exc
    _header.wait(work, wait_for)
