"""The digest header (issue 16) as a pure function: contributions, their MAX reduction, the decoded verdict.

The all_reduce is simulated by an element-wise max of the contributions, which is what gloo and NCCL
compute. Properties: a digest that says "agreed" implies the row verdict finds nothing and hands
every rank src's exact row and payload (sound); rows that differ in a word the ranks must share never
look agreed (exact: the digest is the words, not a hash); honest agreeing calls do agree (complete).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distinit.broadcast import _digest
from distinit.broadcast._bounds import DEFAULT_MAX_BYTES
from distinit.broadcast._digest import DIGEST_BYTES, DIGEST_WORDS, contribution, decode, digest_from
from distinit.broadcast._header import (
    FIXED_WORDS,
    FLAG_FLAT,
    FLAG_ZERO_COPY,
    NOT_INLINE,
    OP_MODULE,
    OP_OBJECT,
    OP_STATE_DICT,
    OP_TENSOR,
    View,
    fixed_words,
)
from distinit.broadcast._mismatch import judge

PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
_VECTOR = struct.Struct(f"={DIGEST_WORDS}q")


def _reduce(rows: list[list[int]], inline: bytes | None = None) -> bytes:
    """The MAX all_reduce of every rank's contribution (rank r contributes ``rows[r]``)."""
    vectors = [
        _VECTOR.unpack(bytes(contribution(row, rank=rank, inline=inline if row[3] == rank else None)))
        for rank, row in enumerate(rows)
    ]
    return _VECTOR.pack(*(max(column) for column in zip(*vectors, strict=True)))


def _tensor_row(rank: int, *, src: int = 0, buffer: bool = True, shape: tuple[int, ...] = (2, 3)) -> list[int]:
    if not buffer:
        return fixed_words(seq=7, op=OP_TENSOR, src=src, global_rank=rank)
    inline = 24 if rank == src else NOT_INLINE
    return fixed_words(
        seq=7, op=OP_TENSOR, src=src, has_buffer=True, dtype=1, device=1, shape=shape, nbytes=24, inline=inline,
        global_rank=rank,
    )  # fmt: skip


def _honest_rows(op: int, size: int, src: int, holders: list[bool], flat: list[bool]) -> list[list[int]]:
    rows = []
    for rank in range(size):
        buffer = holders[rank] or rank == src
        if op == OP_TENSOR:
            rows.append(_tensor_row(rank, src=src, buffer=buffer))
        elif op == OP_OBJECT:
            sent = 9 if rank == src else 0
            inline = sent or NOT_INLINE
            rows.append(fixed_words(seq=3, op=op, src=src, fingerprint=11, aux_nbytes=sent, inline=inline,
                                    limit=DEFAULT_MAX_BYTES - rank))  # fmt: skip
        else:
            rows.append(fixed_words(seq=3, op=op, src=src, has_buffer=buffer, fingerprint=5 if buffer else 0,
                                    count=2 if buffer else 0, flags=FLAG_FLAT if flat[rank] else 0))  # fmt: skip
    return rows


@st.composite
def honest_calls(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    op = draw(st.sampled_from([OP_TENSOR, OP_OBJECT, OP_STATE_DICT, OP_MODULE]))
    size = draw(st.integers(1, 6))
    src = draw(st.integers(0, size - 1))
    holders = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    flat = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return op, _honest_rows(op, size, src, holders, flat)


@PROPERTIES
@given(call=honest_calls())
def test_honest_calls_agree_and_every_rank_gets_srcs_row_and_the_groups_minimums(
    call: tuple[int, list[list[int]]],
) -> None:
    op, rows = call
    src = rows[0][3]
    payload = bytes(range(24)) if op == OP_TENSOR else b'"abcdefg"' if op == OP_OBJECT else None
    exchanged = decode(_reduce(rows, payload), len(rows))
    assert exchanged is not None
    assert exchanged.views[src] == View.from_words(rows[src])
    assert exchanged.inline_bytes(src) == (payload or b"")
    views = [View.from_words(row) for row in rows]
    assert judge(views, my_op=op, seq=7) is None
    summary = exchanged.views[(src + 1) % len(rows)] if len(rows) > 1 else exchanged.views[src]
    if len(rows) > 1:
        assert summary.has_buffer == all(v.has_buffer for v in views)
        assert bool(summary.flags & FLAG_FLAT) == all(v.flags & FLAG_FLAT for v in views)
        assert summary.limit == min(v.limit for v in views)


@st.composite
def forged_calls(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    """An honest call with any words of any ranks replaced by any int64."""
    op, rows = draw(honest_calls())
    for _ in range(draw(st.integers(1, 4))):
        rank = draw(st.integers(0, len(rows) - 1))
        rows[rank][draw(st.integers(0, FIXED_WORDS - 1))] = draw(
            st.one_of(INT64, st.integers(-2, 70), st.sampled_from([-(1 << 63), (1 << 63) - 1]))
        )
    return op, rows


@PROPERTIES
@given(call=forged_calls())
def test_a_digest_that_agrees_implies_the_row_verdict_passes_with_srcs_exact_row(
    call: tuple[int, list[list[int]]],
) -> None:
    _, rows = call
    exchanged = decode(_reduce(rows), len(rows))
    if exchanged is None:
        return  # the rows are compared instead: the row path's verdict, whatever it is
    views = [View.from_words(row) for row in rows]
    src = views[0].src
    assert judge(views, my_op=views[0].op, seq=7) is None
    assert exchanged.views[src] == views[src]


SHARED = [0, 1, 2, 3, 5]  # magic, sequence, call kind, src, status
TENSOR_HOLDER = [6, 7, 8, *range(9, 21), 21]  # device, dtype, ndim, the 12 shape words, byte count


@PROPERTIES
@given(word=st.sampled_from(SHARED + TENSOR_HOLDER), value=INT64, size=st.integers(2, 5), data=st.data())
def test_rows_that_differ_in_a_checked_word_never_look_agreed(
    word: int, value: int, size: int, data: st.DataObject
) -> None:
    rows = [_tensor_row(rank) for rank in range(size)]
    receiver = data.draw(st.integers(1, size - 1))
    if rows[receiver][word] == value:
        return
    rows[receiver][word] = value
    assert decode(_reduce(rows), size) is None


@pytest.mark.parametrize("receiver_has_buffer", [False, True])
def test_a_receiver_without_a_buffer_does_not_take_part_in_the_tensor_words(receiver_has_buffer: bool) -> None:
    rows = [_tensor_row(0), _tensor_row(1, buffer=receiver_has_buffer, shape=(3, 2))]
    agreed = decode(_reduce(rows, bytes(24)), 2)
    assert (agreed is not None) == (not receiver_has_buffer)  # a buffer of float32[3, 2] must match src's


def test_an_objects_size_cap_is_the_smallest_of_the_group() -> None:
    rows = [
        fixed_words(seq=1, op=OP_OBJECT, src=0, fingerprint=4, aux_nbytes=5000, limit=DEFAULT_MAX_BYTES),
        fixed_words(seq=1, op=OP_OBJECT, src=0, fingerprint=4, limit=4999),
    ]
    assert decode(_reduce(rows), 2) is None
    rows[1][28] = 5000
    assert decode(_reduce(rows), 2) is not None


def test_the_digest_vector_has_one_size_whatever_the_call() -> None:
    sizes = {
        len(contribution(row, rank=rank, inline=b"x" * 9 if row[3] == rank else None))
        for rank in range(2)
        for row in (_tensor_row(rank), fixed_words(seq=1, op=OP_OBJECT, src=0), fixed_words(seq=1, op=99, src=5))
    }
    assert sizes == {DIGEST_BYTES}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(None, 64, id="unset-default"),
        pytest.param("2", 2, id="two"),
        pytest.param("1", 1, id="one"),
        pytest.param("4096", 4096, id="large"),
    ],
)
def test_the_threshold_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str | None, expected: int
) -> None:
    if text is None:
        monkeypatch.delenv(_digest.DIGEST_FROM_ENV, raising=False)
    else:
        monkeypatch.setenv(_digest.DIGEST_FROM_ENV, text)
    digest_from.cache_clear()
    try:
        assert digest_from() == expected
    finally:
        digest_from.cache_clear()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(" 64", id="leading-space"),
        pytest.param("0", id="zero"),
        pytest.param("-1", id="negative"),
        pytest.param("1e3", id="float-syntax"),
        pytest.param("0x40", id="hex"),
        pytest.param("99999999999", id="over-2^31"),
        pytest.param("sixty-four", id="words"),
    ],
)
def test_a_bad_threshold_names_the_variable_and_the_fix(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(_digest.DIGEST_FROM_ENV, text)
    digest_from.cache_clear()
    try:
        with pytest.raises(ValueError, match="DISTINIT_BROADCAST_DIGEST_FROM") as caught:
            digest_from()
    finally:
        digest_from.cache_clear()
    assert repr(text) in str(caught.value)
    assert "the same value on every rank" in str(caught.value)


@pytest.mark.parametrize("differ", [False, True])
def test_flag_bits_other_than_flat_must_be_shared_and_reach_every_view(differ: bool) -> None:
    transport = 1 << 4  # a flag bit every rank must share (the payload transport uses such bits)
    rows = [
        fixed_words(seq=1, op=OP_STATE_DICT, src=0, has_buffer=True, fingerprint=5, count=2, flags=transport),
        fixed_words(seq=1, op=OP_STATE_DICT, src=0, flags=0 if differ else transport | FLAG_FLAT),
    ]
    exchanged = decode(_reduce(rows), 2)
    if differ:
        assert exchanged is None  # the rows are compared, where every rank's flags are seen
    else:
        assert exchanged is not None
        assert [view.flags for view in exchanged.views] == [transport, transport]  # flat only if every rank is


@pytest.mark.parametrize("asked", [(False, False, False), (False, True, False), (True, False, False)])
def test_zero_copy_may_differ_and_every_view_says_whether_some_rank_asked(asked: tuple[bool, ...]) -> None:
    """``via="auto"`` settles from the views: the digest carries "some rank asked for zero_copy" (a MAX)."""
    auto = 1 << 8
    rows = [
        fixed_words(seq=1, op=OP_STATE_DICT, src=0, has_buffer=rank == 0, fingerprint=5 if rank == 0 else 0,
                    count=2 if rank == 0 else 0, flags=auto | (FLAG_ZERO_COPY if wants else 0))
        for rank, wants in enumerate(asked)
    ]  # fmt: skip
    exchanged = decode(_reduce(rows), len(rows))
    assert exchanged is not None  # a difference in zero_copy alone is no disagreement
    some = any(view.flags & FLAG_ZERO_COPY for view in exchanged.views)
    assert some == any(asked)
    assert all(view.flags & ~(FLAG_ZERO_COPY | FLAG_FLAT) == auto for view in exchanged.views)
