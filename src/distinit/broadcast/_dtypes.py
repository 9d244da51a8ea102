"""Stable wire codes for dtypes and device types, and how tensors are described in messages."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Codes are part of the wire protocol: never renumber, only append. Dtypes missing from an older
# torch are skipped, so a peer that sends one we cannot build gets a clear "unknown dtype" error. The
# element size is part of the table (not asked of torch) so every rank checks a header's byte count
# alike, whatever its torch version knows.
_DTYPES: tuple[tuple[int, str, int], ...] = (  # (code, name, bytes per element)
    (1, "float32", 4),
    (2, "float64", 8),
    (3, "float16", 2),
    (4, "bfloat16", 2),
    (5, "uint8", 1),
    (6, "int8", 1),
    (7, "int16", 2),
    (8, "int32", 4),
    (9, "int64", 8),
    (10, "bool", 1),
    (11, "complex64", 8),
    (12, "complex128", 16),
    (13, "complex32", 4),
    (14, "uint16", 2),
    (15, "uint32", 4),
    (16, "uint64", 8),
    (17, "float8_e4m3fn", 1),
    (18, "float8_e5m2", 1),
    (19, "float8_e4m3fnuz", 1),
    (20, "float8_e5m2fnuz", 1),
    (21, "float8_e8m0fnu", 1),
    (22, "float4_e2m1fn_x2", 1),
    (23, "bits8", 1),
    (24, "bits16", 2),
)

CODE_OF_DTYPE: dict[torch.dtype, int] = {
    getattr(torch, name): code for code, name, _ in _DTYPES if isinstance(getattr(torch, name, None), torch.dtype)
}
DTYPE_OF_CODE: dict[int, torch.dtype] = {code: dtype for dtype, code in CODE_OF_DTYPE.items()}
NAME_OF_CODE: dict[int, str] = {code: name for code, name, _ in _DTYPES}
ITEMSIZE_OF_CODE: dict[int, int] = {code: size for code, _, size in _DTYPES}
"""Bytes per element of every dtype code the protocol defines (known to this torch or not)."""

NO_DTYPE = 0

_DEVICE_TYPES: tuple[str, ...] = ("none", "cpu", "cuda", "meta", "xpu", "mps", "hpu", "privateuseone")
CODE_OF_DEVICE_TYPE: dict[str, int] = {name: code for code, name in enumerate(_DEVICE_TYPES)}
OTHER_DEVICE = 99


def dtype_code(dtype: torch.dtype) -> int:
    """The wire code of ``dtype``, or -1 when distinit cannot send it (quantized dtypes)."""
    return CODE_OF_DTYPE.get(dtype, -1)


def dtype_name(code: int) -> str:
    """``float32`` for code 1; a readable placeholder for codes this torch does not know."""
    if code == NO_DTYPE:
        return "?"
    return NAME_OF_CODE.get(code, f"<dtype code {code}>")


def device_type_code(device: torch.device) -> int:
    """The wire code of the device *type* (the index is each rank's own business)."""
    return CODE_OF_DEVICE_TYPE.get(device.type, OTHER_DEVICE)


def device_type_name(code: int) -> str:
    """``cpu`` for code 1."""
    if 0 <= code < len(_DEVICE_TYPES):
        return _DEVICE_TYPES[code]
    return "other"


def describe(code: int, shape: Sequence[int]) -> str:
    """``float32[1024, 768]``: dtype and shape as users write them; a scalar reads ``float32[]``."""
    return f"{dtype_name(code)}[{', '.join(str(d) for d in shape)}]"
