"""The collective verdict: decide from every rank's header view whether a call may proceed.

Pure functions of the gathered views, so every rank reaches the same verdict and composes the
same :class:`~distinit.errors.BroadcastMismatchError`; all the wording lives here.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence

from distinit.broadcast._dtypes import describe, device_type_name, dtype_name
from distinit.broadcast._header import MAGIC, OP_NAMES, OP_OBJECT, OP_TENSOR, View
from distinit.errors import BroadcastMismatchError

# Local problems a rank reports in its header instead of raising alone (which would leave its peers
# waiting in the collective). Codes are part of the wire protocol.
OK = 0
SRC_PASSED_NONE = 1
NOT_A_TENSOR = 2
UNSUPPORTED_DTYPE = 3
TOO_MANY_DIMS = 4
SERIALIZE_FAILED = 5
NOT_A_STATE_DICT = 6
NOT_STRIDED = 7
NO_DEVICE = 8
TOO_LARGE = 9
BAD_TYPE = 10

STATUS_TEXT = {
    SRC_PASSED_NONE: "is src but passed None (src must pass the data)",
    NOT_A_TENSOR: "passed something that is not a torch.Tensor (receivers may pass None)",
    UNSUPPORTED_DTYPE: "passed a tensor whose dtype distinit cannot send (quantized dtypes are not supported)",
    TOO_MANY_DIMS: "passed a tensor with more than 12 dimensions",
    SERIALIZE_FAILED: "could not serialise its object as the given type= (see that rank's chained error)",
    NOT_A_STATE_DICT: "passed a state dict that is not a Mapping[str, torch.Tensor]",
    NOT_STRIDED: "passed a sparse or otherwise non-strided tensor (call .to_dense() first)",
    NO_DEVICE: "cannot place the received tensor: the requested device type is not available on this rank",
    TOO_LARGE: "would send more bytes than a header can describe",
    BAD_TYPE: "passed a type= pydantic cannot build a schema for (see that rank's chained error)",
}


FIELD_PHRASE = {
    "protocol": "the protocol",
    "sequence": "the call sequence",
    "call": "the call",
    "src": "src",
    "argument": "its arguments",
    "device": "device type",
    "dtype": "dtype",
    "shape": "shape",
    "schema": "the object schema",
    "keys": "the key set",
    "metadata": "tensor dtypes and shapes",
}
"""``field`` codes (``BroadcastMismatchError.field``) and how messages name them."""


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
        phrase = FIELD_PHRASE.get(self.field, self.field)
        head = f"{self.call} call #{self.seq} ({src}, {self.size} ranks) disagrees on {phrase}"
        body = self.detail or _join_views(self.views, self.src)
        tail = (
            f"Raised on all {self.size} ranks; the data was discarded."
            if self.sent
            else f"Raised on all {self.size} ranks; no data was written."
        )
        return BroadcastMismatchError(
            f"{head}: {body}. {tail}",
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
    if my_op == OP_TENSOR:
        key = (sv.device, sv.dtype, sv.shape)
        return all((v.device, v.dtype, v.shape) == key for r, v in enumerate(views) if r != src and v.has_buffer)
    if my_op == OP_OBJECT:
        return all(v.fingerprint == sv.fingerprint for v in views)
    return all(v.fingerprint == sv.fingerprint for r, v in enumerate(views) if r != src and v.has_buffer)


def judge(views: Sequence[View], *, my_op: int, seq: int) -> Mismatch | None:
    """The verdict on one call, identical on every rank given the same ``views``.

    Checks, in order: protocol, sequence, call kind, src, local argument problems, then what
    each call kind needs (device type, dtype and shape of buffers; the schema fingerprint of
    objects; the metadata fingerprint of state dicts and modules).
    """
    if agreed(views, my_op):
        return None
    size = len(views)
    call = OP_NAMES.get(my_op, "broadcast")

    def mismatch(field: str, ranks: Sequence[int], text: dict[int, str], why: str, fix: str) -> Mismatch:
        return Mismatch(call, seq, size, src, field, tuple(sorted(ranks)), text, why, fix)

    src: int | None = None
    bad = [r for r, v in enumerate(views) if v.magic != MAGIC]
    if bad:
        return mismatch(
            "protocol",
            bad,
            {r: ("sent an unreadable header" if r in bad else "sent a distinit header") for r in range(size)},
            "those ranks run another distinit version, or are inside a different collective at this point",
            "run the same distinit version on every rank, and make every rank of the group make the same calls",
        )
    seqs = [v.seq for v in views]
    if len(set(seqs)) > 1:
        common = _majority(seqs)
        return mismatch(
            "sequence",
            [r for r, s in enumerate(seqs) if s != common],
            {r: f"reached broadcast call #{s} in this group" for r, s in enumerate(seqs)},
            "a rank skipped or added a broadcast call (one inside `if rank == ...`, or an early return or "
            "caught exception on some ranks)",
            "make every rank of the group make the same distinit broadcast calls in the same order",
        )
    ops = [v.op for v in views]
    if len(set(ops)) > 1:
        common = _majority(ops)
        return mismatch(
            "call",
            [r for r, o in enumerate(ops) if o != common],
            {r: f"called {OP_NAMES.get(o, f'op {o}')}" for r, o in enumerate(ops)},
            "the ranks are at different call sites of the program",
            "make every rank of the group make the same distinit broadcast calls in the same order",
        )
    srcs = [v.src for v in views]
    if len(set(srcs)) > 1 or not 0 <= srcs[0] < size:
        common = _majority(srcs)
        faulty = [r for r, s in enumerate(srcs) if s != common or not 0 <= s < size]
        return mismatch(
            "src",
            faulty,
            {
                r: f"gave src={s}" + ("" if 0 <= s < size else f" (outside the group of {size})")
                for r, s in enumerate(srcs)
            },
            "ranks that disagree on src would each wait for a different sender until the process-group timeout",
            "pass the same src on every rank; within a subgroup src is the rank *in the group* "
            "(0..group size-1), not the global rank",
        )
    src = srcs[0]
    faulty = [r for r, v in enumerate(views) if v.status != 0]
    if faulty:
        return mismatch(
            "argument",
            faulty,
            {r: STATUS_TEXT.get(views[r].status, f"reported problem code {views[r].status}") for r in faulty},
            "a rank could not take part with what it was given; it reported that instead of leaving its peers waiting",
            f"fix the argument on {ranks_phrase(faulty)} (that rank's error chains the local cause)",
        )
    sv = views[src]
    if my_op == OP_TENSOR:
        return _judge_tensor(views, src, mismatch)
    if my_op == OP_OBJECT:
        bad = [r for r, v in enumerate(views) if v.fingerprint != sv.fingerprint]
        if bad:
            return mismatch(
                "schema",
                bad,
                {
                    r: f"gave a type= with schema fingerprint {views[r].fingerprint & 0xFFFFFFFF:08x}"
                    for r in [src, *bad]
                },
                "the type= passed on those ranks differs from src's (another class, field set, or code version)",
                "pass the same type= on every rank, from the same version of the code",
            )
        return None
    bad = [r for r, v in enumerate(views) if v.has_buffer and r != src and v.fingerprint != sv.fingerprint]
    if bad:
        return mismatch(
            "keys",
            bad,
            {
                r: f"has {views[r].count} tensors (fingerprint {views[r].fingerprint & 0xFFFFFFFF:08x})"
                for r in [src, *bad]
            },
            "the models or state dicts differ in their keys, dtypes or shapes",
            "build the same model (same config and code version) on every rank before broadcasting",
        )
    return None


def _judge_tensor(views: Sequence[View], src: int, make: Callable[..., Mismatch]) -> Mismatch | None:
    sv = views[src]

    def view_text(r: int) -> str:
        v = views[r]
        if r == src:
            return f"sends {describe(v.dtype, v.shape)} on {device_type_name(v.device)}"
        return f"passed a buffer of {describe(v.dtype, v.shape)} on {device_type_name(v.device)}"

    receivers = [r for r, v in enumerate(views) if r != src and v.has_buffer]
    bad = [r for r in receivers if views[r].device != sv.device]
    if bad:
        return make(
            "device",
            bad,
            {r: view_text(r) for r in [src, *bad]},
            "every rank must hold the tensor on the same device type: NCCL moves only CUDA tensors on the current "
            "device, gloo moves CPU tensors (CUDA ones are staged through CPU); a mix is usually a missed .to()",
            f"place the buffers on {device_type_name(sv.device)} on {ranks_phrase(bad)}, or pass None there "
            "and device= to choose where the result lands",
        )
    bad = [r for r in receivers if views[r].dtype != sv.dtype]
    if bad:
        return make(
            "dtype",
            bad,
            {r: view_text(r) for r in [src, *bad]},
            "a raw broadcast copies bytes, so the receiver would reinterpret them "
            f"({dtype_name(sv.dtype)} bits read as {dtype_name(views[bad[0]].dtype)} values)",
            f"allocate the buffers with dtype=torch.{dtype_name(sv.dtype)} on {ranks_phrase(bad)}, or pass None there",
        )
    bad = [r for r in receivers if views[r].shape != sv.shape]
    if bad:
        src_numel = math.prod(sv.shape)
        numels = {math.prod(views[r].shape) for r in bad}
        if numels == {src_numel}:
            why = (
                "same element count, other shape: torch.distributed.broadcast would have filled the buffer "
                "silently, wrongly laid out"
            )
        elif all(n < src_numel for n in numels):
            why = (
                "the buffer is smaller than what src sends: with a raw broadcast gloo kills the receiving process "
                "(SIGABRT) while src carries on"
            )
        elif all(n > src_numel for n in numels):
            why = (
                "the buffer is larger than what src sends: a raw broadcast fills only its start and leaves stale "
                "values in the rest"
            )
        else:
            why = "the buffers differ in size from what src sends: a raw broadcast would corrupt or abort"
        dims = ", ".join(str(d) for d in sv.shape)
        return make(
            "shape",
            bad,
            {r: view_text(r) for r in [src, *bad]},
            why,
            f"pass None on receivers to allocate from the sender's header, or allocate "
            f"torch.empty({dims}{',' if len(sv.shape) == 1 else ''}) on {ranks_phrase(bad)}",
        )
    return None
