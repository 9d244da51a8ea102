"""Property tests: whatever a peer puts in its header row, metadata or JSON, decoding gives the documented error.

The verdict is a pure function of every rank's row, so a verdict here is the verdict on every rank.
Forged rows never make it raise anything: it returns None (and then the row is one whose sizes are
consistent and bounded, so no rank allocates or receives more than the row says) or a mismatch
whose error is a ``BroadcastMismatchError`` naming the rank at fault.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pydantic
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distinit.broadcast import _header, _object
from distinit.broadcast._bounds import DEFAULT_MAX_BYTES, MAX_METADATA_BYTES, MAX_TENSOR_BYTES, header_problem
from distinit.broadcast._dtypes import ITEMSIZE_OF_CODE
from distinit.broadcast._group import GroupFacts
from distinit.broadcast._header import (
    FIXED_BYTES,
    FIXED_WORDS,
    HEADER_BYTES,
    INLINE_BYTES,
    NOT_INLINE,
    OP_MODULE,
    OP_OBJECT,
    OP_STATE_DICT,
    OP_TENSOR,
    Exchange,
    View,
    fixed_words,
)
from distinit.broadcast._layout import decode_meta
from distinit.broadcast._mismatch import judge
from distinit.errors import BroadcastMismatchError

PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPS = [OP_TENSOR, OP_OBJECT, OP_STATE_DICT, OP_MODULE]
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
HOSTILE_INT = st.one_of(
    st.integers(-8, 64),
    st.sampled_from([NOT_INLINE, 999, 1 << 31, (1 << 40) - 1, 1 << 48, 1 << 62, (1 << 63) - 1, -(1 << 63)]),
    INT64,
)


def _honest_row(op: int, *, src: bool) -> list[int]:
    if op == OP_TENSOR and src:
        return fixed_words(seq=7, op=op, src=0, has_buffer=True, dtype=1, device=1, shape=(2, 3), nbytes=24)
    if op in (OP_STATE_DICT, OP_MODULE) and src:
        return fixed_words(seq=7, op=op, src=0, has_buffer=True, fingerprint=5, count=2)
    return fixed_words(seq=7, op=op, src=0, limit=DEFAULT_MAX_BYTES if op == OP_OBJECT else 0)


@st.composite
def forged_rows(draw: st.DrawFn) -> tuple[int, list[int]]:
    """An op and src's row for it, with any subset of its words replaced by hostile values."""
    op = draw(st.sampled_from(OPS))
    row = _honest_row(op, src=True)
    for index in draw(st.lists(st.integers(0, FIXED_WORDS - 1), max_size=6)):
        row[index] = draw(HOSTILE_INT)
    return op, row


def _assert_bounded(sv: View, op: int, views: list[View]) -> None:
    """What a passed verdict guarantees about src's row: consistent sizes within the protocol's bounds."""
    assert header_problem(sv, op) is None
    if op == OP_TENSOR:
        assert sv.nbytes == math.prod(sv.shape) * ITEMSIZE_OF_CODE[sv.dtype] <= MAX_TENSOR_BYTES
        assert sv.inline in (NOT_INLINE, sv.nbytes) and (sv.inline == NOT_INLINE or sv.nbytes <= INLINE_BYTES)
    elif op == OP_OBJECT:
        assert min(sv.aux_nbytes, sv.nbytes) >= 0
        assert sv.aux_nbytes + sv.nbytes <= min(v.limit for v in views)
    else:
        assert 0 <= sv.aux_nbytes <= MAX_METADATA_BYTES and sv.count >= 0


@PROPERTIES
@given(forged=forged_rows(), receivers=st.integers(1, 3))
def test_every_forged_src_row_is_passed_bounded_or_refused_naming_a_rank(
    forged: tuple[int, list[int]], receivers: int
) -> None:
    op, row = forged
    views = [View.from_words(row), *(View.from_words(_honest_row(op, src=False)) for _ in range(receivers))]
    verdict = judge(views, my_op=op, seq=7)
    if verdict is None:
        _assert_bounded(views[0], op, views)
        return
    error = verdict.error()
    assert isinstance(error, BroadcastMismatchError)
    assert error.ranks and all(0 <= r < len(views) for r in error.ranks)
    assert verdict == judge(views, my_op=op, seq=7)  # pure: the same verdict on every rank


@PROPERTIES
@given(
    rows=st.lists(st.binary(min_size=FIXED_BYTES, max_size=FIXED_BYTES), min_size=2, max_size=2),
    op=st.sampled_from(OPS),
)
def test_any_received_table_decodes_and_is_judged_without_raising(rows: list[bytes], op: int) -> None:
    raw = bytearray(2 * HEADER_BYTES)  # random fixed words; the inline bytes behind them are the row's to say
    for index, row in enumerate(rows):
        raw[index * HEADER_BYTES : index * HEADER_BYTES + FIXED_BYTES] = row
    exchanged = Exchange(raw, 2)
    assert len(exchanged.views) == 2
    verdict = judge(exchanged.views, my_op=op, seq=1)
    if verdict is not None:
        assert isinstance(verdict.error(), BroadcastMismatchError)


@PROPERTIES
@given(words=st.lists(INT64, min_size=FIXED_WORDS, max_size=FIXED_WORDS))
def test_rows_of_any_int64_words_round_trip_the_wire(words: list[int]) -> None:
    raw = bytearray(HEADER_BYTES)
    struct.pack_into(f"={FIXED_WORDS}q", raw, 0, *words)
    view = Exchange(raw, 1).views[0]
    assert len(view.shape) <= _header.MAX_NDIM and isinstance(view.has_buffer, bool)


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), HOSTILE_INT, st.floats(allow_nan=True), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=20,
)


def _as_json(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()


@PROPERTIES
@given(raw=st.one_of(st.binary(max_size=64), JSONISH.map(_as_json), st.integers(1, 5000).map(lambda n: b"[" * n)))
def test_forged_state_dict_metadata_is_a_value_error_or_bounded(raw: bytes) -> None:
    try:
        meta = decode_meta(raw)
    except ValueError:
        return
    for key, code, shape in meta:
        assert isinstance(key, str) and code in ITEMSIZE_OF_CODE
        assert all(d >= 0 for d in shape) and math.prod(shape) * ITEMSIZE_OF_CODE[code] <= MAX_TENSOR_BYTES


class Holder(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    name: str
    weight: torch.Tensor


MARKER = st.fixed_dictionaries(
    {"__distinit_tensor__": HOSTILE_INT, "dtype": HOSTILE_INT, "shape": st.lists(HOSTILE_INT, max_size=4)}
)


@st.composite
def forged_payloads(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """JSON for ``Holder`` with forged markers, optionally nested deep, plus announced tensor count and bytes."""
    depth = draw(st.sampled_from([0, 1, 50, 250, 900]))
    marker = draw(st.one_of(MARKER, JSONISH))
    weight = _as_json(marker)
    payload = b'{"name": "w", "weight": ' + b"[" * depth + weight + b"]" * depth + b"}"
    return payload, draw(st.integers(0, 3)), draw(st.integers(0, 64))


@pytest.fixture(scope="module")
def ctx() -> Any:
    facts = GroupFacts(torch.nn.Module(), size=2, rank=1, global_rank=1, device=torch.device("cpu"))
    return facts.next_call(op=OP_OBJECT, src=0, timeout=None)


@PROPERTIES
@given(forged=forged_payloads())
def test_forged_object_payloads_are_payload_errors_naming_src(ctx: Any, forged: tuple[bytes, int, int]) -> None:
    payload, count, nbytes = forged
    tensor_bytes = torch.zeros(nbytes, dtype=torch.uint8)
    outcome: Any
    try:
        outcome = _object._decode_or_raise(ctx, payload, tensor_bytes, count=count, tp=Holder)
    except BroadcastMismatchError as exc:
        outcome = exc
    if isinstance(outcome, BroadcastMismatchError):
        assert (outcome.field, outcome.ranks) == ("payload", (0,))
    else:  # accepted: a marker that describes exactly the bytes that were sent
        assert isinstance(outcome, Holder)
        assert outcome.weight.nbytes == nbytes
