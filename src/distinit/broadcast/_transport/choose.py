"""Choosing a transport (``via=``): the option, its agreement on every rank, hosts, the route, and the move.

``via`` travels in the header's flags word (bits 8-11), so the header verdict already holds every rank's
choice; a difference is one more :class:`~distinit.errors.BroadcastMismatchError`, raised on every rank
before any payload moves. The same word carries whether a rank asked for ``zero_copy``, so ``via="auto"``
settles on the network from the verified header alone (:func:`settled`: no rank asked, or the payload is
under :data:`AUTO_SHM_MIN_BYTES`), with no collective of its own. Any other call that does not take the
network path then runs one small all_gather (:func:`agree`): each rank's host key (``boot_id`` plus the
device of ``/dev/shm``, never ``LOCAL_WORLD_SIZE``), the free space of its ``/dev/shm`` and a random token.
Every rank decides the same :class:`Route` from that table (:func:`decide` is pure), and :func:`move`
takes it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import struct
from collections.abc import Sequence

import torch

from distinit.broadcast import _header
from distinit.broadcast._group import CallContext
from distinit.broadcast._mismatch import Mismatch, timeout_error
from distinit.broadcast._transport import file, shm
from distinit.broadcast._transport.pack import ALIGN, VIA_SHIFT, VIAS, Route, Spec, Via, slots
from distinit.broadcast._transport.shm import SHM_DIR

logger = logging.getLogger("distinit.broadcast")

AUTO_SHM_MIN_BYTES = 16 << 20
AUTO_SHM_MIN_RANKS = 4
"""``via="auto"`` takes shared memory where it measured faster than the network on the 2-vCPU test machine
before issue 23's hardening (``benchmarks/bench_broadcast.py --parts via``, docs/broadcast.md "What it costs":
after it, the leader's comparison makes zero-copy about tie with the network at 256 MiB): some rank asked for
``zero_copy``, a host holds at least :data:`AUTO_SHM_MIN_RANKS` ranks, and the payload is at least
:data:`AUTO_SHM_MIN_BYTES`. Copying receivers were slower by shm than by gloo there (two copies and fresh
tmpfs pages against one loopback copy), so ``auto`` leaves them on the network."""
AUTO_POOL_MIN_BYTES = 64 << 20
"""Since issue 27's segment pool, ``via="auto"`` also takes shared memory for copying receivers: from the
second consecutive call of a payload size of at least this many bytes (``shm.repeated``), when every sharing
host's leader admits it under its pool cap (``DISTINIT_SHM_POOL_BYTES``). Measured
(``benchmarks/bench_broadcast.py --parts repeat``): the pool 1.79-2.01x the network at 64 MiB and 1.91-2.54x at
256 MiB (world 2), 2.11-2.31x and 2.72-3.35x (world 4); 1.09-1.66x at 16 MiB; a first call pays for the pool."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"
PID_NS = "/proc/self/ns/pid"

ROW_WORDS = 6  # host key (2 words), free /dev/shm bytes, token (2 words), pool cap


NETWORK = Via("network")


def via_option(via: object, *, path: object = None, zero_copy: object = False, keep: object = False) -> Via:
    """``via``, ``path``, ``zero_copy`` and ``keep`` checked and bundled (local argument errors, like ``timeout``).

    Raises:
        TypeError: a value of the wrong type.
        ValueError: an unknown ``via``, ``path`` missing for (or given without) ``via="file"``,
            ``zero_copy`` without shared memory, ``keep`` without a file.
    """
    if not isinstance(via, str) or via not in VIAS:
        raise ValueError(f"via must be one of {sorted(VIAS)}, got {via!r}")
    for name, value in (("zero_copy", zero_copy), ("keep", keep)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if path is not None and not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a directory path (str or os.PathLike), got {type(path).__name__}")
    if (via == "file") != (path is not None):
        raise ValueError(f"path= is required with via='file' and only with it (got via={via!r}, path={path!r})")
    if zero_copy and via not in ("shm", "auto"):
        raise ValueError(f"zero_copy=True needs via='shm' or via='auto' (got via={via!r})")
    if keep and via != "file":
        raise ValueError(f"keep=True only applies to via='file' (got via={via!r})")
    return Via(via, os.fspath(path) if path is not None else None, bool(zero_copy), bool(keep))


def check_agreed(ctx: CallContext, views: Sequence[_header.View]) -> None:
    """Raise when ranks passed different ``via=``, from the header views (no extra collective).

    Row exchanges (groups below the digest threshold) hold every rank's flags. The digest path of large
    groups compares every flag bit but "flattened" across ranks: when they agree, its summary views carry
    the one agreed value; when they differ, the call fell back to the full rows. Either way every rank sees
    every rank's ``via`` and raises the same error.

    Raises:
        BroadcastMismatchError: ``field="transport"``; ``ranks`` are those that differ from src.
    """
    names = {code: name for name, code in VIAS.items()}
    codes = {r: (view.flags >> VIA_SHIFT) & 0xF for r, view in enumerate(views)}
    if len(set(codes.values())) == 1:
        return
    raise Mismatch(
        call=ctx.call,
        seq=ctx.seq,
        size=ctx.size,
        src=ctx.src,
        field="transport",
        ranks=tuple(r for r, code in codes.items() if code != codes[ctx.src]),
        views={r: f"passed via={names.get(code, str(code))!r}" for r, code in codes.items()},
        why="every rank must move the payload the same way: the transports take part in different collectives",
        fix="pass the same via= on every rank (the per-rank path= and zero_copy= may differ)",
    ).error()


def host_key() -> tuple[int, int]:
    """Two words naming this process's host: ``boot_id``, the device of ``/dev/shm`` and the pid namespace.

    The first two are NCCL's own test. A private mount namespace with its own ``/dev/shm`` (a container) is
    another host: its segments are not ours. So is another pid namespace (containers sharing ``/dev/shm``
    through ``--ipc=host``): readers open the leader's segment through ``/proc/<leader pid>/fd``, which
    another pid namespace cannot name.
    Without a readable boot_id the key is random, so this rank shares memory with no one.
    """
    try:
        with open(BOOT_ID, encoding="ascii") as fh:
            boot = fh.read().strip()
        dev = os.stat(SHM_DIR).st_dev
        pid_ns = os.stat(PID_NS).st_ino
    except OSError:
        return struct.unpack("<qq", secrets.token_bytes(16))
    digest = hashlib.blake2b(f"{boot}\0{dev}\0{pid_ns}".encode(), digest_size=16).digest()
    return struct.unpack("<qq", digest)


def shm_free() -> int:
    """Bytes an unprivileged writer may still allocate in ``/dev/shm`` (statvfs), -1 if unknown."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def group_hosts(keys: Sequence[tuple[int, int]], src: int) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by host key, leader first; src's host first, the others by their lowest rank."""
    by_key: dict[tuple[int, int], list[int]] = {}
    for rank, key in enumerate(keys):
        by_key.setdefault(key, []).append(rank)
    hosts = [ranks if src not in ranks else [src, *(r for r in ranks if r != src)] for ranks in by_key.values()]
    return tuple(tuple(h) for h in sorted(hosts, key=lambda h: (h[0] != src, min(h))))


def settled(via: str, *, zero_copy: bool, total: int, size: int, repeat: bool = False) -> Route | None:
    """The route when the verified header alone decides it, else None (the ranks must agree on hosts).

    ``via="auto"`` stays on the network unless some rank asked for ``zero_copy`` (``zero_copy``: the header
    verdict's answer, the same on every rank) and the payload is at least :data:`AUTO_SHM_MIN_BYTES`; ``total``
    follows from the verified call, so every rank settles alike, without a collective. Nor when ``repeat`` (the
    group's previous auto call moved as many bytes, :data:`AUTO_POOL_MIN_BYTES` or more: the pool's case). A
    group of one rank (``size``) shares memory with no one: shm and auto take the network (as :func:`decide`
    would say).
    """
    if via == "file" or (via == "shm" and size > 1):
        return None
    if total == 0:
        return Route("network", (), "", "nothing to move")
    if size == 1:
        return Route("network", ((0,),), "", _NOT_SHARED.format(ranks=1))
    if via != "auto":
        return None
    if zero_copy and total >= AUTO_SHM_MIN_BYTES:
        return None
    if repeat and not zero_copy and total >= AUTO_POOL_MIN_BYTES:  # the pool's case: agree on hosts and caps
        return None
    return Route("network", (), "", _auto_note(total))


_NOT_SHARED = "no two of the {ranks} ranks share a host (boot_id and /dev/shm device differ)"


def _auto_note(total: int, per_host: int | None = None) -> str:
    hosts = f", hosts of {per_host} ranks at most" if per_host is not None else ""
    return (
        f"via='auto' keeps the network unless a rank asks for zero_copy, a host holds >= {AUTO_SHM_MIN_RANKS} "
        f"ranks and the payload is >= {AUTO_SHM_MIN_BYTES} bytes, or the same payload of >= {AUTO_POOL_MIN_BYTES} "
        f"bytes comes again within every leader's pool cap ({total} bytes{hosts})"
    )


def decide(
    via: str, rows: Sequence[Sequence[int]], *, src: int, total: int, zero_copy: bool, repeat: bool = False
) -> Route:
    """The route every rank takes, from every rank's agreement row (pure: the same on every rank).

    ``rows[r]``: rank r's host key (2 words), its free /dev/shm bytes and its token (2 words; src's is used).
    ``zero_copy``: whether some rank asked for ``zero_copy`` (from the header verdict). ``repeat``: the
    group's previous auto call moved as many bytes; then each row's 6th word, the rank's pool cap, counts.
    """
    hosts = group_hosts([(int(row[0]), int(row[1])) for row in rows], src)
    token = f"{int(rows[src][3]) & (2**63 - 1):016x}{int(rows[src][4]) & (2**63 - 1):016x}"
    if via == "file":
        return Route("file", hosts, token)
    shared = [h for h in hosts if len(h) > 1]
    note = ""
    if total == 0:
        note = "nothing to move"
    elif not shared:
        note = _NOT_SHARED.format(ranks=len(rows))
    elif via == "auto" and not _auto_pays(zero_copy, shared, total) and not _pool_pays(rows, shared, total, repeat):
        note = _auto_note(total, max(len(h) for h in shared))
    else:
        short = [h[0] for h in shared if int(rows[h[0]][2]) < total + ALIGN]
        if short:
            free = int(rows[short[0]][2])
            note = f"{SHM_DIR} of rank {short[0]}'s host has {free} bytes free, the payload needs {total}"
    return Route("network" if note else "shm", hosts, token, note)


def _auto_pays(zero_copy: bool, shared: Sequence[tuple[int, ...]], total: int) -> bool:
    """Whether shared memory measured faster than the network for such a call (see :data:`AUTO_SHM_MIN_RANKS`)."""
    return zero_copy and total >= AUTO_SHM_MIN_BYTES and max(len(h) for h in shared) >= AUTO_SHM_MIN_RANKS


def _pool_pays(rows: Sequence[Sequence[int]], shared: Sequence[tuple[int, ...]], total: int, repeat: bool) -> bool:
    """Whether a repeated call is large enough for the pool and every sharing host's leader admits it (cap)."""
    admitted = all(len(rows[h[0]]) > 5 and int(rows[h[0]][5]) >= total for h in shared)
    return repeat and total >= AUTO_POOL_MIN_BYTES and admitted


def agree(ctx: CallContext, via: Via, views: Sequence[_header.View], spec: Spec) -> Route:
    """The route of a verified call with ``via`` other than "network" (logged; a warning on shm's fallback).

    Settled from the header ``views`` when they suffice (:func:`settled`), else one small all_gather of host
    keys, free space and tokens decides it (:func:`decide`).

    Raises:
        BroadcastTimeoutError: the exchange timed out or lost a peer.
    """
    total = slots(spec)[1]
    zero_copy = any(view.flags & _header.FLAG_ZERO_COPY for view in views)
    repeat = via.name == "auto" and shm.repeated(ctx.group, total) and not zero_copy  # recorded on every auto call
    route = settled(via.name, zero_copy=zero_copy, total=total, size=ctx.size, repeat=repeat) or _gathered(
        ctx, via, total, zero_copy, repeat
    )
    logger.debug(
        "rank %d: %s call #%d moves %d bytes by %s (%d hosts)%s",
        ctx.rank, ctx.call, ctx.seq, total, route.kind, len(route.hosts), f": {route.note}" if route.note else "",
        extra={"distinit": {"event": "broadcast.route", "call": ctx.call, "seq": ctx.seq, "rank": ctx.rank,
                            "route": route.kind, "hosts": [list(h) for h in route.hosts], "nbytes": total}},
    )  # fmt: skip
    if route.kind == "network" and via.name == "shm" and total:
        logger.warning(
            "rank %d: %s call #%d: via='shm' falls back to the network: %s",
            ctx.rank, ctx.call, ctx.seq, route.note,
            extra={"distinit": {"event": "broadcast.via_fallback", "call": ctx.call, "seq": ctx.seq,
                                "rank": ctx.rank, "reason": route.note, "nbytes": total}},
        )  # fmt: skip
    return route


def _gathered(ctx: CallContext, via: Via, total: int, zero_copy: bool, repeat: bool) -> Route:
    """The route :func:`decide` makes of every rank's host key, free space and token (one all_gather)."""
    hi, lo = host_key()
    cap = shm.pool_cap()
    words = [hi, lo, shm_free(), secrets.randbits(63), secrets.randbits(63), -1 if cap is None else cap]
    row = torch.tensor(words, dtype=torch.int64)
    try:
        blobs = _header.exchange_blobs(
            row.view(torch.uint8), width=ROW_WORDS * 8, group_size=ctx.size, group=ctx.group,
            device=ctx.comm_device, wait_for=ctx.wait_for,
        )  # fmt: skip
    except _header.CollectiveFailed as exc:
        raise timeout_error(ctx, "transport agreement", exc) from exc
    rows = [b.view(torch.int64).tolist() for b in blobs]
    return decide(via.name, rows, src=ctx.src, total=total, zero_copy=zero_copy, repeat=repeat)


def move(
    ctx: CallContext,
    route: Route,
    via: Via,
    spec: Spec,
    names: list[str],
    sources: list[torch.Tensor] | None,
    outs: list[torch.Tensor | None],
) -> list[torch.Tensor]:
    """This rank's tensors, moved through shared memory or a file by ``route`` (:func:`agree`; not the network).

    Runs on every rank of a call whose verdict passed. ``spec`` is the call's (dtype, shape) list, the same
    on every rank; ``sources`` src's tensors; ``outs`` a receiver's buffers (``None`` entries: allocate, or
    view shared pages with ``zero_copy``).
    """
    if route.kind == "shm":
        return shm.transfer(ctx, route, spec, sources, outs, via.zero_copy)
    return file.transfer(ctx, route, via, spec, names, sources, outs)
