"""The collective verdict: decide from every rank's header view whether a call may proceed.

Pure functions of the gathered views, so every rank reaches the same verdict and composes the
same :class:`~distinit.errors.BroadcastMismatchError`; all the wording lives here, including the errors
one rank raises alone after the verdict (:func:`rank_error`, :func:`missing_dtype`, :func:`timeout_error`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from distinit._foreign import first_line
from distinit.broadcast._bounds import MAX_BYTES_ENV, PROBLEM_OF_OP, header_problem
from distinit.broadcast._dtypes import describe, device_type_name, dtype_name
from distinit.broadcast._group import CallContext
from distinit.broadcast._header import (
    MAGIC,
    OP_MODULE,
    OP_NAMES,
    OP_OBJECT,
    OP_STATE_DICT,
    OP_TENSOR,
    CollectiveFailed,
    View,
)
from distinit.errors import BroadcastMismatchError, BroadcastTimeoutError

# Local problems a rank reports in its header instead of raising alone (which would leave its peers
# waiting in the collective). Codes are part of the wire protocol: 8 and 9 were retired (nothing sent them).
OK = 0
SRC_PASSED_NONE = 1
NOT_A_TENSOR = 2
UNSUPPORTED_DTYPE = 3
TOO_MANY_DIMS = 4
SERIALIZE_FAILED = 5
NOT_A_STATE_DICT = 6
NOT_STRIDED = 7
BAD_TYPE = 10

STATUS_TEXT = {
    SRC_PASSED_NONE: "is src but passed None (src must pass the data)",
    NOT_A_TENSOR: "passed something that is not a torch.Tensor (receivers may pass None)",
    UNSUPPORTED_DTYPE: "passed a tensor whose dtype distinit cannot send (quantized dtypes are not supported)",
    TOO_MANY_DIMS: "passed a tensor with more than 12 dimensions",
    SERIALIZE_FAILED: "could not serialise its object as the given type= (see that rank's chained error)",
    NOT_A_STATE_DICT: "passed a state dict that is not a Mapping[str, torch.Tensor]",
    NOT_STRIDED: "passed a sparse or otherwise non-strided tensor (call .to_dense() first)",
    BAD_TYPE: "passed a type= pydantic cannot build a schema for (see that rank's chained error)",
}


FIELD_PHRASE = {
    "protocol": "the protocol",
    "sequence": "the call sequence",
    "call": "the call",
    "src": "src",
    "argument": "its arguments",
    "header": "a well-formed header",
    "size": "the payload size",
    "device": "device type",
    "dtype": "dtype",
    "shape": "shape",
    "schema": "the object schema",
    "keys": "the key set",
    "metadata": "tensor dtypes and shapes",
}
"""``field`` codes (``BroadcastMismatchError.field``) and how messages name them."""

_HEADS = {"header": "got a malformed header", "size": "would exceed a receiver's size limit"}
"""Fields whose message does not read "disagrees on ..." (a fault of one rank, not a disagreement)."""


@dataclasses.dataclass(frozen=True)
class Found:
    """What one check of the verdict found: the field, the ranks at fault, each rank's view, why and the fix."""

    field: str
    ranks: tuple[int, ...]
    views: dict[int, str]
    why: str
    fix: str


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The facts of a failed verdict, from which the message is composed."""

    call: str
    seq: int
    size: int
    src: int | None
    field: str
    ranks: tuple[int, ...]
    views: dict[int, str]
    why: str
    fix: str
    detail: str = ""
    sent: bool = False

    def error(self) -> BroadcastMismatchError:
        """The error every rank raises, worded identically."""
        src = f"src={self.src}" if self.src is not None else "src disputed"
        head = _HEADS.get(self.field) or f"disagrees on {FIELD_PHRASE.get(self.field, self.field)}"
        body = self.detail or _join_views(self.views, self.src)
        tail = "the data was discarded" if self.sent else "no data was written"
        return BroadcastMismatchError(
            f"{self.call} call #{self.seq} ({src}, {self.size} ranks) {head}: {body}. "
            f"Raised on all {self.size} ranks; {tail}.",
            call=self.call,
            seq=self.seq,
            field=self.field,
            src=self.src,
            views=self.views,
            ranks=self.ranks,
            why=self.why,
            fix=self.fix,
        )


def ranks_phrase(ranks: Sequence[int]) -> str:
    """``rank 2``, ``ranks 2 and 3``, ``ranks 1, 2 and 5``."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(str(r) for r in ranks[:-1])} and {ranks[-1]}"


def _join_views(views: dict[int, str], src: int | None) -> str:
    """Group ranks with the same view: ``rank 0 sends float32[2]; ranks 1 and 2 passed ...``."""
    by_text: dict[str, list[int]] = {}
    order = sorted(views, key=lambda r: (r != src, r))
    for rank in order:
        by_text.setdefault(views[rank], []).append(rank)
    return "; ".join(f"{ranks_phrase(ranks)} {text}" for text, ranks in by_text.items())


def _majority(values: Sequence[int]) -> int:
    counts = Counter(values)
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def agreed(views: Sequence[View], my_op: int) -> bool:
    """One pass over the views: True when :func:`judge` would find nothing (the common case).

    Each test here is one of :func:`judge`'s checks, so ``agreed`` implies no mismatch; when it
    says False, :func:`judge` runs in full and names what differs.
    """
    first = views[0]
    src = first.src
    if not 0 <= src < len(views):
        return False
    for v in views:
        if v.magic != MAGIC or v.seq != first.seq or v.op != first.op or v.src != src or v.status:
            return False
    sv = views[src]
    if PROBLEM_OF_OP[my_op](sv) is not None:
        return False
    if my_op == OP_TENSOR:
        key = (sv.device, sv.dtype, sv.shape)
        return all((v.device, v.dtype, v.shape) == key for r, v in enumerate(views) if r != src and v.has_buffer)
    if my_op == OP_OBJECT:
        total = sv.aux_nbytes + sv.nbytes
        return all(v.fingerprint == sv.fingerprint and v.limit >= total for v in views)
    return all(v.fingerprint == sv.fingerprint for r, v in enumerate(views) if r != src and v.has_buffer)


def judge(views: Sequence[View], *, my_op: int, seq: int) -> Mismatch | None:
    """The verdict on one call, identical on every rank given the same ``views``.

    Checks, in order: protocol, sequence, call kind, src, local argument problems, src's header
    (well formed, within every rank's size limit), then what each call kind needs (device type,
    dtype and shape of buffers; the schema fingerprint of objects; the metadata fingerprint of
    state dicts and modules).
    """
    if agreed(views, my_op):
        return None
    call = OP_NAMES.get(my_op, "broadcast")
    for check in (_protocol, _sequence, _call_kind, _src):
        found = check(views)
        if found is not None:
            return _mismatch(found, call=call, seq=seq, size=len(views), src=None)
    src = views[0].src
    for call_check in (_argument, _header, _size_limit, _CALL_CHECKS[my_op]):
        found = call_check(views, src)
        if found is not None:
            return _mismatch(found, call=call, seq=seq, size=len(views), src=src)
    return None


def _mismatch(found: Found, *, call: str, seq: int, size: int, src: int | None) -> Mismatch:
    return Mismatch(call=call, seq=seq, size=size, src=src, **vars(found))


def _found(field: str, ranks: Sequence[int], views: dict[int, str], *, why: str, fix: str) -> Found:
    return Found(field=field, ranks=tuple(sorted(ranks)), views=views, why=why, fix=fix)


def _protocol(views: Sequence[View]) -> Found | None:
    bad = [r for r, v in enumerate(views) if v.magic != MAGIC]
    if not bad:
        return None
    return _found(
        "protocol",
        bad,
        {r: ("sent an unreadable header" if r in bad else "sent a distinit header") for r in range(len(views))},
        why="those ranks run another distinit version, or are inside a different collective at this point",
        fix="run the same distinit version on every rank, and make every rank of the group make the same calls",
    )


def _sequence(views: Sequence[View]) -> Found | None:
    seqs = [v.seq for v in views]
    if len(set(seqs)) == 1:
        return None
    common = _majority(seqs)
    return _found(
        "sequence",
        [r for r, s in enumerate(seqs) if s != common],
        {r: f"reached broadcast call #{s} in this group" for r, s in enumerate(seqs)},
        why="a rank skipped or added a broadcast call (one inside `if rank == ...`, or an early return or "
        "caught exception on some ranks)",
        fix="make every rank of the group make the same distinit broadcast calls in the same order",
    )


def _call_kind(views: Sequence[View]) -> Found | None:
    ops = [v.op for v in views]
    if len(set(ops)) == 1:
        return None
    common = _majority(ops)
    return _found(
        "call",
        [r for r, o in enumerate(ops) if o != common],
        {r: f"called {OP_NAMES.get(o, f'op {o}')}" for r, o in enumerate(ops)},
        why="the ranks are at different call sites of the program",
        fix="make every rank of the group make the same distinit broadcast calls in the same order",
    )


def _src(views: Sequence[View]) -> Found | None:
    size, srcs = len(views), [v.src for v in views]
    if len(set(srcs)) == 1 and 0 <= srcs[0] < size:
        return None
    common = _majority(srcs)
    return _found(
        "src",
        [r for r, s in enumerate(srcs) if s != common or not 0 <= s < size],
        {r: f"gave src={s}" + ("" if 0 <= s < size else f" (outside the group of {size})") for r, s in enumerate(srcs)},
        why="ranks that disagree on src would each wait for a different sender until the process-group timeout",
        fix="pass the same src on every rank; within a subgroup src is the rank *in the group* "
        "(0..group size-1), not the global rank",
    )


def _argument(views: Sequence[View], src: int) -> Found | None:
    faulty = [r for r, v in enumerate(views) if v.status != 0]
    if not faulty:
        return None
    return _found(
        "argument",
        faulty,
        {r: STATUS_TEXT.get(views[r].status, f"reported problem code {views[r].status}") for r in faulty},
        why="a rank could not take part with what it was given; it reported that instead of leaving its peers waiting",
        fix=f"fix the argument on {ranks_phrase(faulty)} (that rank's error chains the local cause)",
    )


def _header(views: Sequence[View], src: int) -> Found | None:
    problem = header_problem(views[src], views[src].op)
    if problem is None:
        return None
    return _found(
        "header",
        [src],
        {src: problem},
        why="a header must describe exactly the bytes that follow it; this one contradicts itself or exceeds a "
        "bound, so no rank allocated or received anything (a corrupt or hostile peer, or another build)",
        fix=f"check what runs on rank {src}: every rank must run the same distinit and torch code",
    )


def _size_limit(views: Sequence[View], src: int) -> Found | None:
    if views[src].op != OP_OBJECT:
        return None
    total = views[src].aux_nbytes + views[src].nbytes
    small = [r for r, v in enumerate(views) if v.limit < total]
    if not small:
        return None
    return _found(
        "size",
        small,
        {
            src: f"sends {total} bytes",
            **{r: f"accepts at most {views[r].limit} bytes (max_bytes=)" for r in small if r != src},
        },
        why="broadcast_object caps what a receiver accepts, because parsing JSON costs many times its size in memory",
        fix=f"pass a larger max_bytes= (or set {MAX_BYTES_ENV}) on every rank, or send large tensors with "
        "broadcast_tensor or broadcast_state_dict",
    )


def _schema(views: Sequence[View], src: int) -> Found | None:
    sv = views[src]
    bad = [r for r, v in enumerate(views) if v.fingerprint != sv.fingerprint]
    if not bad:
        return None
    return _found(
        "schema",
        bad,
        {r: f"gave a type= with schema fingerprint {views[r].fingerprint & 0xFFFFFFFF:08x}" for r in [src, *bad]},
        why="the type= passed on those ranks differs from src's (another class, field set, or code version)",
        fix="pass the same type= on every rank, from the same version of the code",
    )


def _layout(views: Sequence[View], src: int) -> Found | None:
    sv = views[src]
    bad = [r for r, v in enumerate(views) if v.has_buffer and r != src and v.fingerprint != sv.fingerprint]
    if not bad:
        return None
    return _found(
        "keys",
        bad,
        {r: f"has {views[r].count} tensors (fingerprint {views[r].fingerprint & 0xFFFFFFFF:08x})" for r in [src, *bad]},
        why="the models or state dicts differ in their keys, dtypes or shapes",
        fix="build the same model (same config and code version) on every rank before broadcasting",
    )


def _tensor(views: Sequence[View], src: int) -> Found | None:
    receivers = [r for r, v in enumerate(views) if r != src and v.has_buffer]
    return _device(views, src, receivers) or _dtype(views, src, receivers) or _shape(views, src, receivers)


def _tensor_text(views: Sequence[View], src: int, rank: int) -> str:
    v = views[rank]
    if rank == src:
        return f"sends {describe(v.dtype, v.shape)} on {device_type_name(v.device)}"
    return f"passed a buffer of {describe(v.dtype, v.shape)} on {device_type_name(v.device)}"


def _device(views: Sequence[View], src: int, receivers: list[int]) -> Found | None:
    sv = views[src]
    bad = [r for r in receivers if views[r].device != sv.device]
    if not bad:
        return None
    return _found(
        "device",
        bad,
        {r: _tensor_text(views, src, r) for r in [src, *bad]},
        why="every rank must hold the tensor on the same device type: NCCL moves only CUDA tensors on the current "
        "device, gloo moves CPU tensors (CUDA ones are staged through CPU); a mix is usually a missed .to()",
        fix=f"place the buffers on {device_type_name(sv.device)} on {ranks_phrase(bad)}, or pass None there "
        "and device= to choose where the result lands",
    )


def _dtype(views: Sequence[View], src: int, receivers: list[int]) -> Found | None:
    sv = views[src]
    bad = [r for r in receivers if views[r].dtype != sv.dtype]
    if not bad:
        return None
    return _found(
        "dtype",
        bad,
        {r: _tensor_text(views, src, r) for r in [src, *bad]},
        why="a raw broadcast copies bytes, so the receiver would reinterpret them "
        f"({dtype_name(sv.dtype)} bits read as {dtype_name(views[bad[0]].dtype)} values)",
        fix=f"allocate the buffers with dtype=torch.{dtype_name(sv.dtype)} on {ranks_phrase(bad)}, or pass None there",
    )


def _shape(views: Sequence[View], src: int, receivers: list[int]) -> Found | None:
    sv = views[src]
    bad = [r for r in receivers if views[r].shape != sv.shape]
    if not bad:
        return None
    dims = ", ".join(str(d) for d in sv.shape)
    return _found(
        "shape",
        bad,
        {r: _tensor_text(views, src, r) for r in [src, *bad]},
        why=_shape_consequence(math.prod(sv.shape), {math.prod(views[r].shape) for r in bad}),
        fix=f"pass None on receivers to allocate from the sender's header, or allocate "
        f"torch.empty({dims}{',' if len(sv.shape) == 1 else ''}) on {ranks_phrase(bad)}",
    )


def _shape_consequence(src_numel: int, numels: set[int]) -> str:
    """What a raw broadcast would have done with receivers of these element counts."""
    if numels == {src_numel}:
        return (
            "same element count, other shape: torch.distributed.broadcast would have filled the buffer silently, "
            "wrongly laid out"
        )
    if all(n < src_numel for n in numels):
        return (
            "the buffer is smaller than what src sends: with a raw broadcast gloo kills the receiving process "
            "(SIGABRT) while src carries on"
        )
    if all(n > src_numel for n in numels):
        return (
            "the buffer is larger than what src sends: a raw broadcast fills only its start and leaves stale "
            "values in the rest"
        )
    return "the buffers differ in size from what src sends: a raw broadcast would corrupt or abort"


_CALL_CHECKS: dict[int, Callable[[Sequence[View], int], Found | None]] = {
    OP_TENSOR: _tensor,
    OP_OBJECT: _schema,
    OP_STATE_DICT: _layout,
    OP_MODULE: _layout,
}


def rank_error(
    ctx: CallContext, detail: str, *, field: str, view: str, at_fault: tuple[int, ...], why: str, fix: str
) -> BroadcastMismatchError:
    """An error this rank raises alone, after the verdict (its peers are elsewhere), worded like the verdict's."""
    return BroadcastMismatchError(
        f"{ctx.call} call #{ctx.seq} (src={ctx.src}, {ctx.size} ranks): {detail}",
        call=ctx.call,
        seq=ctx.seq,
        field=field,
        src=ctx.src,
        views={ctx.rank: view},
        ranks=at_fault,
        why=why,
        fix=fix,
    )


def missing_dtype(ctx: CallContext, code: int, what: str) -> BroadcastMismatchError:
    """Src sends ``what`` in a dtype the protocol defines but this rank's torch lacks."""
    return rank_error(
        ctx,
        f"src sends {what} as {dtype_name(code)}, which this torch ({torch.__version__}) does not have, "
        f"on rank {ctx.rank}",
        field="dtype",
        view=f"lacks dtype {dtype_name(code)}",
        at_fault=(ctx.rank,),
        why="the ranks run different torch versions",
        fix="run the same torch version on every rank",
    )


def timeout_error(ctx: CallContext, phase: str, exc: CollectiveFailed) -> BroadcastTimeoutError:
    """The error for a call whose collective timed out or lost a peer (raised on this rank only)."""
    if exc.timed_out:
        limit = f"{ctx.timeout} s (timeout=)" if ctx.timeout is not None else "the process-group timeout"
        what = f"did not complete its {phase} within {limit}"
    else:
        what = f"lost a peer during its {phase}"
    return BroadcastTimeoutError(
        f"{ctx.call} call #{ctx.seq} (src={ctx.src}, {ctx.size} ranks) {what} on rank {ctx.rank} "
        f"(global rank {ctx.global_rank}): {first_line(str(exc))}",
        call=ctx.call,
        seq=ctx.seq,
        field="timeout" if exc.timed_out else "peer",
        src=ctx.src,
        views={ctx.rank: f"waited for the {phase}"},
        ranks=(),
        why="another rank of the group never reached this call (it crashed, hangs, or takes another code path), "
        "or a peer died mid-transfer",
        fix="read the other ranks' logs for the first error; the process group is unusable after this, "
        "so destroy it (or restart the job)",
    )
