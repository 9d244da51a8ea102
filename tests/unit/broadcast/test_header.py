import pytest
import torch

from distinit.broadcast import _header
from distinit.broadcast._header import (
    FIXED_WORDS,
    HEADER_WORDS,
    INLINE_BYTES,
    MAGIC,
    MAX_NDIM,
    OP_STATE_DICT,
    View,
    fixed_words,
)


def test_row_size_is_the_same_for_every_call() -> None:
    assert HEADER_WORDS == FIXED_WORDS + INLINE_BYTES // 8


def test_words_round_trip() -> None:
    words = fixed_words(
        seq=9, op=OP_STATE_DICT, src=2, has_buffer=True, status=0, dtype=1, device=1, shape=(4, 0, 7),
        nbytes=123, fingerprint=(1 << 62) + 5, count=3, aux_nbytes=40, inline=40, global_rank=6,
    )  # fmt: skip
    assert len(words) == FIXED_WORDS
    v = View.from_words(words)
    assert (v.magic, v.seq, v.op, v.src, v.has_buffer, v.shape, v.nbytes) == (
        MAGIC,
        9,
        OP_STATE_DICT,
        2,
        True,
        (4, 0, 7),
        123,
    )
    assert (v.fingerprint, v.count, v.aux_nbytes, v.inline, v.global_rank) == ((1 << 62) + 5, 3, 40, 40, 6)


def test_scalar_and_no_tensor_views() -> None:
    assert View.from_words(fixed_words(seq=1, op=1, src=0, shape=())).shape == ()
    assert View.from_words(fixed_words(seq=1, op=1, src=0)).ndim == -1


@pytest.mark.parametrize("ndim", [-5, MAX_NDIM + 40])
def test_garbage_ndim_never_raises(ndim: int) -> None:
    words = fixed_words(seq=1, op=1, src=0)
    words[8] = ndim
    assert len(View.from_words(words).shape) <= MAX_NDIM


def test_scratch_row_is_rewritten_without_stale_inline_bytes() -> None:
    scratch = _header.Scratch(1)
    assert scratch.take() and not scratch.take()  # one call at a time
    words = fixed_words(seq=1, op=1, src=0, inline=6)
    scratch.dirty = _header._fill_row(scratch.buffer, scratch.address, scratch.dirty, words, b"abcdef")
    assert bytes(scratch.buffer[_header.FIXED_BYTES : _header.FIXED_BYTES + 8]) == b"abcdef\0\0"
    payload = torch.tensor([7], dtype=torch.int16)
    scratch.dirty = _header._fill_row(scratch.buffer, scratch.address, scratch.dirty, words, payload)
    assert scratch.dirty == 2
    assert bytes(scratch.buffer[_header.FIXED_BYTES : _header.FIXED_BYTES + 8]) == payload.numpy().tobytes() + bytes(6)
    scratch.give_back()
    assert scratch.take()


def test_fixed_words_pad_every_field() -> None:
    for shape in [None, (), (3,), tuple(range(1, MAX_NDIM + 1))]:
        words = fixed_words(seq=1, op=1, src=0, shape=shape, global_rank=5)
        assert len(words) == FIXED_WORDS
        assert View.from_words(words).global_rank == 5


def test_inline_payload_lands_bit_exactly_and_autograd_sees_the_write() -> None:
    payload = torch.tensor([1.5, -0.0, float("nan")], dtype=torch.float32)
    raw = bytearray(_header.HEADER_BYTES)
    _header._FIXED.pack_into(raw, 0, *fixed_words(seq=1, op=1, src=0, inline=payload.nbytes))
    raw[_header.FIXED_BYTES : _header.FIXED_BYTES + payload.nbytes] = payload.numpy().tobytes()
    exchanged = _header.Exchange(raw, 1)
    out = torch.zeros(3, requires_grad=True)
    version = out._version
    assert exchanged.copy_inline_into(0, out)
    assert out._version > version
    assert torch.equal(out.detach().view(torch.int32), payload.view(torch.int32))
    assert exchanged.inline_bytes(0) == payload.numpy().tobytes()
    assert not exchanged.copy_inline_into(0, torch.zeros(6)[::2])  # non-contiguous: the caller copies with torch
    assert not exchanged.copy_inline_into(0, torch.zeros(4))  # another size: never a partial write
