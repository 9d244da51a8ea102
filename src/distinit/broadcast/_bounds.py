"""What a header row may announce: the bounds every rank checks before a payload collective or an allocation.

A header comes from a peer, so nothing in it is trusted. Every rank checks src's row against these
bounds in the same pure verdict (``_mismatch.judge``), so a row that contradicts itself (a byte count
that is not shape x element size, an unknown dtype code, a negative or huge length) is refused on every
rank alike, before any rank enters a payload collective or allocates what the row announces. That is
what keeps a forged row from making gloo abort a receiver (it aborts when a broadcast's sizes differ).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable

from distinit.broadcast._dtypes import ITEMSIZE_OF_CODE, describe
from distinit.broadcast._header import (
    INLINE_BYTES,
    MAX_NDIM,
    NOT_INLINE,
    OP_MODULE,
    OP_OBJECT,
    OP_STATE_DICT,
    OP_TENSOR,
    View,
)

MAX_TENSOR_BYTES = 1 << 48
"""The most bytes one tensor header may announce (256 TiB: above any real tensor, far below int64 overflow)."""

MAX_METADATA_BYTES = 64 << 20
"""The most bytes of state-dict metadata (``[[key, dtype, shape], ...]`` JSON) a header may announce
(~600,000 tensors with 100-character names)."""

METADATA_SLACK = 64 << 10
"""When ranks compare their state-dict metadata, each may send up to twice src's length plus this."""

DEFAULT_MAX_BYTES = 64 << 20
"""``broadcast_object``'s default cap on what src may send (JSON plus tensor bytes): 64 MiB."""

MAX_BYTES_ENV = "DISTINIT_BROADCAST_MAX_BYTES"
"""Environment variable that sets ``broadcast_object``'s cap when ``max_bytes=`` is not passed."""

_LIMIT_CEILING = 1 << 62
_DECIMAL = re.compile(r"[0-9]{1,19}")


def max_object_bytes(max_bytes: int | None) -> int:
    """The cap for one ``broadcast_object`` call: ``max_bytes``, else the environment, else the default.

    Raises:
        TypeError: ``max_bytes`` is not an int (a bool included).
        ValueError: ``max_bytes`` or :data:`MAX_BYTES_ENV` is not a whole number of bytes from 1 to 2**62.
    """
    if max_bytes is None:
        return environment_cap()
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int number of bytes or None, got {type(max_bytes).__name__}")
    if not 1 <= max_bytes <= _LIMIT_CEILING:
        raise ValueError(f"max_bytes must be from 1 to 2**62 bytes, got {max_bytes!r}")
    return max_bytes


@functools.lru_cache(maxsize=1)
def environment_cap() -> int:
    """:data:`MAX_BYTES_ENV`, else :data:`DEFAULT_MAX_BYTES`; read once per process (tests clear the cache).

    Once, because reading ``os.environ`` costs 1-3 µs, a measurable part of a small call's Python.

    Raises:
        ValueError: the variable is not a whole number of bytes from 1 to 2**62 (raised again on every call).
    """
    text = os.environ.get(MAX_BYTES_ENV)
    if text is None:
        return DEFAULT_MAX_BYTES
    value = int(text) if _DECIMAL.fullmatch(text) else 0
    if not 1 <= value <= _LIMIT_CEILING:
        raise ValueError(f"{MAX_BYTES_ENV}={text!r} must be a whole number of bytes from 1 to 2**62")
    return value


def metadata_width(src_length: int) -> int:
    """How many metadata bytes each rank may send when ranks compare state dicts (derived from src's only)."""
    return min(2 * max(0, src_length) + METADATA_SLACK, MAX_METADATA_BYTES)


def header_problem(view: View, op: int) -> str | None:
    """What is wrong with src's row for a call of kind ``op``, in words; None when it is well formed.

    Pure and cheap (it runs on the happy path of every call, on every rank).
    """
    return PROBLEM_OF_OP.get(op, _state_dict_problem)(view)


def _tensor_problem(v: View) -> str | None:
    # The common case first, in one expression (every call runs it); the words only when it fails.
    itemsize, shape = ITEMSIZE_OF_CODE.get(v.dtype), v.shape
    if itemsize is not None and v.has_buffer and 0 <= v.ndim <= MAX_NDIM and (not shape or min(shape) >= 0):
        expected = math.prod(shape) * itemsize
        inline = v.inline
        if v.nbytes == expected <= MAX_TENSOR_BYTES and (inline == NOT_INLINE or inline == expected <= INLINE_BYTES):
            return None
    return _tensor_problem_text(v, itemsize)


def _tensor_problem_text(v: View, itemsize: int | None) -> str:
    if not v.has_buffer:
        return "announced no tensor although it is src"
    if itemsize is None:
        return f"announced dtype code {v.dtype}, which the protocol does not define"
    if not 0 <= v.ndim <= MAX_NDIM or (v.shape and min(v.shape) < 0):
        return f"announced an impossible shape (ndim {v.ndim}, dims {list(v.shape)})"
    expected = math.prod(v.shape) * itemsize
    if expected > MAX_TENSOR_BYTES:
        return f"announced {describe(v.dtype, v.shape)}: {expected} bytes, over the {MAX_TENSOR_BYTES} a header may"
    if v.nbytes != expected:
        return f"announced {describe(v.dtype, v.shape)} in {v.nbytes} bytes (shape x element size is {expected})"
    return f"announced {describe(v.dtype, v.shape)} ({expected} bytes) with {v.inline} inline bytes"


def _object_problem(v: View) -> str | None:
    if v.aux_nbytes < 0 or v.nbytes < 0 or not 0 <= v.count <= v.aux_nbytes:
        return f"announced {v.aux_nbytes} JSON bytes and {v.count} tensors of {v.nbytes} bytes"
    if v.inline != NOT_INLINE and (v.inline != v.aux_nbytes or v.inline > INLINE_BYTES or v.count or v.nbytes):
        return f"announced {v.aux_nbytes} JSON bytes and {v.count} tensors with {v.inline} inline bytes"
    return None


def _state_dict_problem(v: View) -> str | None:
    if not v.has_buffer:
        return "announced no tensors although it is src"
    if v.count < 0 or not 0 <= v.aux_nbytes <= MAX_METADATA_BYTES:
        return f"announced {v.count} tensors with {v.aux_nbytes} bytes of metadata (at most {MAX_METADATA_BYTES})"
    if v.inline != NOT_INLINE and (v.inline != v.aux_nbytes or v.inline > INLINE_BYTES):
        return f"announced {v.aux_nbytes} bytes of metadata with {v.inline} inline bytes"
    return None


PROBLEM_OF_OP: dict[int, Callable[[View], str | None]] = {
    OP_TENSOR: _tensor_problem,
    OP_OBJECT: _object_problem,
    OP_STATE_DICT: _state_dict_problem,
    OP_MODULE: _state_dict_problem,
}
""":func:`header_problem` by call kind (the verdict's fast path looks its check up here directly)."""
