"""``broadcast_state_dict``, and the protocol it shares with ``broadcast_module``: many tensors, one fingerprint.

Every rank fingerprints its key set and per-tensor (dtype, shape); the header exchange compares
the fingerprints, and only when they differ do the ranks exchange their full metadata to say
exactly which keys differ. Receivers without a state dict learn the metadata from src, which every
rank then checks alike before anything is allocated. Payloads move per the cached staging plan
(:mod:`distinit.broadcast._staging`, :mod:`distinit.broadcast._pipeline`), or zero-copy through
the flat buffers of a flattened module (:mod:`distinit.broadcast._flat`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch

from distinit._foreign import first_line
from distinit.broadcast import _flat, _header, _mismatch, _pipeline, _plan
from distinit.broadcast._bounds import metadata_width
from distinit.broadcast._dtypes import DTYPE_OF_CODE, dtype_code
from distinit.broadcast._group import CallContext, resolve
from distinit.broadcast._handshake import handshake
from distinit.broadcast._layout import Entry, Layout, decode_meta, diff_metadata, encode_meta, entries, layout
from distinit.broadcast._staging import staged_plan
from distinit.broadcast._transport.choose import NETWORK, agree, check_agreed, move, via_option
from distinit.broadcast._transport.pack import (
    Route,
    Spec,
    Via,
    allocate,
    broadcast_bytes,
    from_bytes,
    to_bytes,
    wait_or_raise,
)

logger = logging.getLogger("distinit.broadcast")

Named = tuple[list[str], list[torch.Tensor]]
"""A rank's tensors and their names, in order."""


def run(
    ctx: CallContext,
    mine: Named | None,
    *,
    status: int,
    bucket_bytes: int,
    device: torch.device | None,
    flat: _flat.FlatState | None = None,
    via: Via = NETWORK,
) -> Named:
    """The protocol of both calls; returns the (names, tensors) this rank ends up with.

    ``mine``: this rank's tensors (None: a receiver that allocates from src's metadata).
    ``flat``: the module's flat state (:func:`distinit.flatten_module_`); the zero-copy path runs when
    every rank has one that matches the call's layout on the collective device (network only).
    ``via``: the transport (:mod:`distinit.broadcast._transport.choose`), the same on every rank (checked).
    """
    lay = layout(*mine) if mine is not None and status == _mismatch.OK else None
    if lay is not None and lay.unsupported:
        status, lay = _mismatch.UNSUPPORTED_DTYPE, None
    mine = mine if lay is not None else None
    if flat is not None and not (lay is not None and flat.fingerprint == lay.fingerprint and flat.on(ctx.comm_device)):
        flat = None  # the module changed since it was flattened, or lives elsewhere: the staged path
    meta = b""
    if mine is not None and ctx.rank == ctx.src and ctx.op == _header.OP_STATE_DICT:
        meta = encode_meta(entries(*mine))  # for receivers passing None
    inline = meta if meta and len(meta) <= _header.INLINE_BYTES else None
    exchanged = handshake(
        ctx,
        _row(ctx, lay, status=status, meta=meta, inline=inline is not None, flat=flat is not None, via=via),
        inline=inline,
        explain=functools.partial(_explain, ctx, mine),
    )
    views = exchanged.views
    check_agreed(ctx, views)
    zero_copy = via.name == "network" and flat is not None and all(v.flags & _header.FLAG_FLAT for v in views)
    if logger.isEnabledFor(logging.DEBUG):
        _log(ctx, views[ctx.src], zero_copy=zero_copy)
    if zero_copy and mine is not None and flat is not None and ctx.size > 1:
        _flat.transfer(ctx, flat, mine[1], send=ctx.rank == ctx.src)
        return mine
    # Some rank allocates from src's metadata: every rank checks it.
    src_meta = _src_metadata(ctx, exchanged, meta) if not all(v.has_buffer for v in views) else None
    if via.name != "network":
        names, spec = _spec(ctx, mine, src_meta)
        route = agree(ctx, via, views, spec)
        if route.kind != "network":
            return names, _move(ctx, route, via, mine, spec, names, device)
    if ctx.size == 1 and mine is not None:  # a world of one: nobody to send to
        return mine
    if mine is None and src_meta is not None:
        mine = _allocate(ctx, src_meta, device)
    if mine is None:  # unreachable: the verdict checked src's status and _allocate returned
        raise RuntimeError(f"{ctx.call}: no tensors to move, but the verdict let the call through")
    plan = staged_plan(lay or layout(*mine), mine[1], bucket_bytes)
    _pipeline.run(ctx, plan, mine[1], send=ctx.rank == ctx.src)
    return mine


def _spec(ctx: CallContext, mine: Named | None, src_meta: list[Entry] | None) -> tuple[list[str], Spec]:
    """The call's names and (dtype, shape) list: this rank's own tensors, or src's checked metadata.

    Raises:
        BroadcastMismatchError: src's metadata holds a dtype this torch lacks (before the transport starts).
    """
    if mine is not None:
        return mine[0], [(t.dtype, tuple(t.shape)) for t in mine[1]]
    meta = src_meta or []
    missing = [(key, code) for key, code, _ in meta if code not in DTYPE_OF_CODE]
    if missing:
        raise _mismatch.missing_dtype(ctx, missing[0][1], repr(missing[0][0]))
    return [key for key, _, _ in meta], [(DTYPE_OF_CODE[code], tuple(shape)) for _, code, shape in meta]


def _move(
    ctx: CallContext,
    route: Route,
    via: Via,
    mine: Named | None,
    spec: Spec,
    names: list[str],
    device: torch.device | None,
) -> list[torch.Tensor]:
    """The tensors moved by shared memory or a file, as ``route`` (not the network) says."""
    outs: list[torch.Tensor | None] = [None] * len(spec)
    if mine is not None and ctx.rank != ctx.src:
        outs = list(mine[1])
    elif mine is None and device is not None and device.type != "cpu":
        outs = [allocate(ctx, shape, dtype=dtype, device=device) for dtype, shape in spec]
    return move(ctx, route, via, spec, names, mine[1] if mine is not None and ctx.rank == ctx.src else None, outs)


def _row(
    ctx: CallContext, lay: Layout | None, *, status: int, meta: bytes, inline: bool, flat: bool, via: Via
) -> list[int]:
    return _header.fixed_words(
        seq=ctx.seq,
        op=ctx.op,
        src=ctx.src,
        has_buffer=lay is not None,
        status=status,
        nbytes=0,  # not needed: the fingerprint covers every tensor's dtype and shape
        fingerprint=lay.fingerprint if lay is not None else 0,
        count=lay.count if lay is not None else 0,
        aux_nbytes=len(meta),
        inline=len(meta) if inline else _header.NOT_INLINE,
        global_rank=ctx.global_rank,
        flags=(_header.FLAG_FLAT if flat else 0) | via.flags,
    )


def _log(ctx: CallContext, sv: _header.View, *, zero_copy: bool) -> None:
    logger.debug(
        "rank %d: %s call #%d from src %d: %d tensors%s",
        ctx.rank,
        ctx.call,
        ctx.seq,
        ctx.src,
        sv.count,
        ", flat (zero-copy)" if zero_copy else "",
        extra=ctx.log_facts(count=sv.count, flat=zero_copy),
    )


def _src_metadata(ctx: CallContext, exchanged: _header.Exchange, meta: bytes) -> list[Entry]:
    """Src's metadata on every rank (inline, or one more broadcast every rank joins), checked alike everywhere.

    Raises:
        BroadcastMismatchError: ``field="header"``, on every rank: it does not parse, breaks a bound,
            or lists another number of tensors than src's header.
    """
    sv = exchanged.views[ctx.src]
    if sv.inline != _header.NOT_INLINE:
        raw: bytes = exchanged.inline_bytes(ctx.src)
    else:
        is_src = ctx.rank == ctx.src
        size = sv.aux_nbytes  # bounded by the verdict
        buf = (
            from_bytes(meta).to(ctx.comm_device)
            if is_src
            else allocate(ctx, (size,), dtype=torch.uint8, device=ctx.comm_device)
        )
        wait_or_raise(broadcast_bytes(buf, ctx), ctx, "metadata broadcast")
        raw = meta if is_src else to_bytes(buf.cpu())
    try:
        decoded = decode_meta(raw)
        problem = "" if len(decoded) == sv.count else f"lists {len(decoded)} tensors, its header {sv.count}"
    except ValueError as exc:
        decoded, problem = [], f"sent metadata that does not parse: {first_line(exc)}"
    if problem:
        raise _malformed(ctx, problem).error()
    return decoded


def _malformed(ctx: CallContext, problem: str) -> _mismatch.Mismatch:
    return _mismatch.Mismatch(
        call=ctx.call,
        seq=ctx.seq,
        size=ctx.size,
        src=ctx.src,
        field="header",
        ranks=(ctx.src,),
        views={ctx.src: problem},
        why="src's metadata must describe exactly the tensors it sends; no rank allocated or received them "
        "(a corrupt or hostile peer, or another build)",
        fix=f"check what runs on rank {ctx.src}: every rank must run the same distinit and torch code",
    )


def _allocate(ctx: CallContext, meta: list[Entry], device: torch.device | None) -> Named:
    """New tensors shaped as src's (checked) metadata says, on ``device`` (default: the collective device)."""
    target = device or ctx.comm_device
    tensors = []
    for key, code, shape in meta:
        dtype = DTYPE_OF_CODE.get(code)
        if dtype is None:  # a dtype the protocol defines but this torch lacks
            raise _mismatch.missing_dtype(ctx, code, repr(key))
        tensors.append(allocate(ctx, shape, dtype=dtype, device=target))
    return [key for key, _, _ in meta], tensors


def _explain(
    ctx: CallContext, mine: Named | None, exchanged: _header.Exchange, verdict: _mismatch.Mismatch
) -> _mismatch.Mismatch | None:
    """Fingerprints differ: exchange every rank's full metadata and say exactly what differs.

    Returns None when the metadata turns out identical (a fingerprint false alarm).
    """
    if verdict.field != "keys":
        return verdict
    metas = _gather_metadata(ctx, exchanged.views, mine)
    field, faulty, views, detail = diff_metadata(metas, ctx.src)
    if field == "header":
        return _malformed(ctx, views[ctx.src])
    if not faulty:
        return None
    return _mismatch.Mismatch(
        call=ctx.call,
        seq=ctx.seq,
        size=ctx.size,
        src=ctx.src,
        field=field,
        ranks=tuple(faulty),
        views=views,
        why="the models or state dicts differ (another config, code version, or a key renamed or wrapped, "
        "e.g. a 'module.' prefix from DDP)",
        fix="build the same model (same config and code) on every rank"
        + (", or pass None on receivers to take src's keys" if ctx.op == _header.OP_STATE_DICT else ""),
        detail=detail,
    )


def _gather_metadata(
    ctx: CallContext, views: Sequence[_header.View], mine: Named | None
) -> list[list[Entry] | str | None]:
    """Every rank's metadata (None: it passed no state dict; a str: why it cannot be read).

    Two all_gathers: the lengths, then the blobs in rows as wide as src's length allows
    (:func:`~distinit.broadcast._bounds.metadata_width`), so a rank announcing a huge length makes
    no rank allocate it; that rank is named instead.
    """
    meta = encode_meta(entries(*mine)) if mine is not None else b""
    length = torch.tensor([len(meta)], dtype=torch.int64).view(torch.uint8)
    gather = functools.partial(
        _header.exchange_blobs, group_size=ctx.size, group=ctx.group, device=ctx.comm_device, wait_for=ctx.wait_for
    )
    lengths = [int(row.view(torch.int64)[0]) for row in gather(length, width=8)]
    width = metadata_width(lengths[ctx.src])
    rows = gather(from_bytes(meta), width=width)
    metas: list[list[Entry] | str | None] = []
    for rank, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        if not views[rank].has_buffer:
            metas.append(None)
        elif not 0 <= n <= width:
            metas.append(f"announced {n} bytes of metadata, more than the {width} allowed")
        else:
            try:
                metas.append(decode_meta(to_bytes(row[:n])))
            except ValueError as exc:
                metas.append(f"sent metadata that does not parse: {first_line(exc)}")
    return metas


def status_of_mapping(sd: object) -> int:
    """The status word for a ``state_dict`` argument (OK, or why this rank cannot take part)."""
    if not isinstance(sd, Mapping):
        return _mismatch.NOT_A_STATE_DICT
    for key, value in sd.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            return _mismatch.NOT_A_STATE_DICT
        if value.layout != torch.strided:
            return _mismatch.NOT_STRIDED
        if dtype_code(value.dtype) < 0:
            return _mismatch.UNSUPPORTED_DTYPE
    return _mismatch.OK


def bucket_size(bucket_bytes: int | None) -> int:
    """``bucket_bytes`` checked, or the default."""
    if bucket_bytes is None:
        return _plan.DEFAULT_BUCKET_BYTES
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int):
        raise TypeError(f"bucket_bytes must be an int number of bytes or None, got {type(bucket_bytes).__name__}")
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive number of bytes or None, got {bucket_bytes!r}")
    return bucket_bytes


def broadcast_state_dict(
    state_dict: Mapping[str, torch.Tensor] | None,
    src: int = 0,
    *,
    group: Any = None,
    bucket_bytes: int | None = None,
    device: torch.device | str | None = None,
    timeout: float | timedelta | None = None,
    via: str = "network",
    path: str | os.PathLike[str] | None = None,
    zero_copy: bool = False,
    keep: bool = False,
) -> dict[str, torch.Tensor]:
    """Broadcast a flat ``{name: tensor}`` state dict from group rank ``src``, checked first.

    Every rank's key set and per-tensor dtype and shape are compared through one fingerprint in
    the header collective; on a difference every rank learns exactly which keys differ. Tensors of
    1 MiB or more are sent in place (no copy); smaller ones are packed into buckets of
    ``bucket_bytes`` (default 4 MiB), four collectives in flight.

    Args:
        state_dict: on src, the tensors. On receivers, ``None`` to allocate from src's metadata
            (keys in src's order), or a state dict to fill in place (keys, dtypes and shapes must
            match src's).
        src: the source rank *within* ``group``.
        group: the process group; ``None`` means the default group.
        bucket_bytes: the size cap of packed buckets.
        device: where receivers passing ``None`` allocate (default: CPU on gloo, the current CUDA
            device on NCCL).
        timeout: seconds (or a timedelta) to wait for each collective of this call.
        via: the transport, as for :func:`~distinit.broadcast.broadcast_tensor`.
        path: with ``via="file"``, a directory every rank sees.
        zero_copy: with shm, receivers passing ``None`` get copy-on-write views of the host's one copy.
        keep: with ``via="file"``, src leaves the file in place.

    Returns:
        On src, a dict of its own tensors; on receivers, the filled or newly allocated tensors.

    Raises:
        BroadcastMismatchError: on every rank, when ranks disagree on src, call order, key set, or a
            tensor's dtype or shape, a rank passed something that is not a ``Mapping[str, Tensor]``,
            or src's header or metadata is malformed (``field="header"``). On a receiver alone, when
            it cannot allocate what src announced (``field="size"``); ``field="transport"``/``"payload"``.
        BroadcastTimeoutError: ``timeout`` expired or a peer died (on the waiting rank).
    """
    bucket = bucket_size(bucket_bytes)
    option = via_option(via, path=path, zero_copy=zero_copy, keep=keep)
    ctx = resolve(group).next_call(op=_header.OP_STATE_DICT, src=src, timeout=timeout)
    mine: Named | None = None
    if state_dict is None:
        status = _mismatch.SRC_PASSED_NONE if ctx.rank == src else _mismatch.OK
    else:
        status = status_of_mapping(state_dict)
        if status == _mismatch.OK:
            mine = list(state_dict.keys()), list(state_dict.values())
    target = torch.device(device) if device is not None else None
    names, tensors = run(ctx, mine, status=status, bucket_bytes=bucket, device=target, via=option)
    return dict(zip(names, tensors, strict=True))
