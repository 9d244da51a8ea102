"""What a header may announce: malformed rows are refused by the verdict; the object size cap and its sources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from distinit.broadcast._bounds import (
    DEFAULT_MAX_BYTES,
    MAX_BYTES_ENV,
    MAX_METADATA_BYTES,
    METADATA_SLACK,
    environment_cap,
    max_object_bytes,
    metadata_width,
)
from distinit.broadcast._dtypes import dtype_code
from distinit.broadcast._header import NOT_INLINE, OP_MODULE, OP_OBJECT, OP_STATE_DICT, OP_TENSOR, View, fixed_words
from distinit.broadcast._mismatch import judge

F32 = dtype_code(torch.float32)


def row(op: int, **kw: object) -> View:
    base: dict[str, object] = {"seq": 3, "op": op, "src": 0}
    if op == OP_TENSOR:
        base.update(has_buffer=True, dtype=F32, device=1, shape=(4,), nbytes=16)
    if op in (OP_STATE_DICT, OP_MODULE):
        base.update(has_buffer=True, fingerprint=9, count=2)
    if op == OP_OBJECT:
        base.update(limit=DEFAULT_MAX_BYTES)
    base.update(kw)
    return View.from_words(fixed_words(**base))  # type: ignore[arg-type]


def receiver(op: int, **kw: object) -> View:
    base: dict[str, object] = {"seq": 3, "op": op, "src": 0, "limit": DEFAULT_MAX_BYTES if op == OP_OBJECT else 0}
    base.update(kw)
    return View.from_words(fixed_words(**base))  # type: ignore[arg-type]


MALFORMED = [
    pytest.param(OP_TENSOR, {"shape": (2,)}, "in 16 bytes (shape x element size is 8)", id="float32[2]-in-16-bytes"),
    pytest.param(OP_TENSOR, {"shape": (-5,), "nbytes": -20}, "impossible shape", id="negative-dim"),
    pytest.param(OP_TENSOR, {"dtype": 999}, "dtype code 999", id="unknown-dtype"),
    pytest.param(OP_TENSOR, {"dtype": 0}, "dtype code 0", id="no-dtype"),
    pytest.param(OP_TENSOR, {"shape": (1 << 31,) * 3, "nbytes": 0}, "over the", id="shape-2^31-cubed"),
    pytest.param(OP_TENSOR, {"inline": 1}, "with 1 inline bytes", id="one-inline-byte"),
    pytest.param(OP_TENSOR, {"has_buffer": False}, "no tensor", id="src-without-tensor"),
    pytest.param(OP_TENSOR, {"shape": (2048,), "nbytes": 8192, "inline": 8192}, "inline", id="inline-over-4KiB"),
    pytest.param(OP_OBJECT, {"aux_nbytes": -10, "nbytes": 10}, "-10 JSON bytes", id="negative-json-length"),
    pytest.param(OP_OBJECT, {"aux_nbytes": 8, "count": -1}, "-1 tensors", id="negative-count"),
    pytest.param(OP_OBJECT, {"aux_nbytes": 8, "inline": 3}, "3 inline bytes", id="inline-shorter-than-json"),
    pytest.param(OP_STATE_DICT, {"aux_nbytes": MAX_METADATA_BYTES + 1}, "bytes of metadata", id="metadata-too-long"),
    pytest.param(OP_STATE_DICT, {"aux_nbytes": -1}, "bytes of metadata", id="negative-metadata-length"),
    pytest.param(OP_MODULE, {"count": -3}, "-3 tensors", id="negative-tensor-count"),
]


@pytest.mark.parametrize(("op", "forged", "words"), MALFORMED)
def test_a_malformed_src_row_is_a_header_verdict_naming_src(op: int, forged: dict[str, object], words: str) -> None:
    views = [row(op, **forged), receiver(op), receiver(op)]
    verdict = judge(views, my_op=op, seq=3)
    assert verdict is not None
    assert (verdict.field, verdict.ranks) == ("header", (0,))
    error = verdict.error()
    assert "got a malformed header: rank 0 announced" in str(error)
    assert words in str(error)


@pytest.mark.parametrize("op", [OP_TENSOR, OP_OBJECT, OP_STATE_DICT, OP_MODULE])
def test_a_well_formed_row_passes(op: int) -> None:
    assert judge([row(op), receiver(op)], my_op=op, seq=3) is None
    assert judge([row(op, inline=NOT_INLINE), receiver(op)], my_op=op, seq=3) is None


def test_an_object_over_a_receivers_cap_is_a_size_verdict_naming_that_receiver() -> None:
    views = [row(OP_OBJECT, aux_nbytes=5000), receiver(OP_OBJECT), receiver(OP_OBJECT, limit=4096)]
    verdict = judge(views, my_op=OP_OBJECT, seq=3)
    assert verdict is not None
    assert (verdict.field, verdict.ranks) == ("size", (2,))
    text = str(verdict.error())
    assert "rank 0 sends 5000 bytes; rank 2 accepts at most 4096 bytes" in text
    assert MAX_BYTES_ENV in verdict.fix


@pytest.fixture(autouse=True)
def _fresh_environment_cap() -> Iterator[None]:
    environment_cap.cache_clear()  # the variable is read once per process
    yield
    environment_cap.cache_clear()


def test_the_cap_comes_from_the_keyword_then_the_environment_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)
    assert max_object_bytes(None) == DEFAULT_MAX_BYTES == 64 << 20
    environment_cap.cache_clear()
    monkeypatch.setenv(MAX_BYTES_ENV, "1000")
    assert max_object_bytes(None) == 1000
    assert max_object_bytes(5) == 5


@pytest.mark.parametrize("text", ["0", "-1", "1e9", "²", " 12", "", "9" * 30])
def test_a_bad_environment_cap_names_the_variable(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(MAX_BYTES_ENV, text)
    with pytest.raises(ValueError, match=MAX_BYTES_ENV):
        max_object_bytes(None)


@pytest.mark.parametrize(("value", "error"), [(True, TypeError), (1.5, TypeError), ("64", TypeError), (0, ValueError)])
def test_a_bad_keyword_cap_names_max_bytes(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_bytes"):
        max_object_bytes(value)  # type: ignore[arg-type]


def test_metadata_width_follows_src_alone() -> None:
    assert metadata_width(100) == 200 + METADATA_SLACK
    assert metadata_width(-(1 << 62)) == METADATA_SLACK
    assert metadata_width(1 << 62) == MAX_METADATA_BYTES
