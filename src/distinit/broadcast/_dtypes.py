"""Stable wire codes for dtypes and device types, and how tensors are described in messages."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Codes are part of the wire protocol: never renumber, only append. Dtypes missing from an older
# torch are skipped, so a peer that sends one we cannot build gets a clear "unknown dtype" mismatch.
_DTYPE_NAMES: tuple[tuple[int, str], ...] = (
    (1, "float32"),
    (2, "float64"),
    (3, "float16"),
    (4, "bfloat16"),
    (5, "uint8"),
    (6, "int8"),
    (7, "int16"),
    (8, "int32"),
    (9, "int64"),
    (10, "bool"),
    (11, "complex64"),
    (12, "complex128"),
    (13, "complex32"),
    (14, "uint16"),
    (15, "uint32"),
    (16, "uint64"),
    (17, "float8_e4m3fn"),
    (18, "float8_e5m2"),
    (19, "float8_e4m3fnuz"),
    (20, "float8_e5m2fnuz"),
    (21, "float8_e8m0fnu"),
    (22, "float4_e2m1fn_x2"),
    (23, "bits8"),
    (24, "bits16"),
)

CODE_OF_DTYPE: dict[torch.dtype, int] = {
    getattr(torch, name): code for code, name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}
DTYPE_OF_CODE: dict[int, torch.dtype] = {code: dtype for dtype, code in CODE_OF_DTYPE.items()}
NAME_OF_CODE: dict[int, str] = dict(_DTYPE_NAMES)

NO_DTYPE = 0

_DEVICE_TYPES: tuple[str, ...] = ("none", "cpu", "cuda", "meta", "xpu", "mps", "hpu", "privateuseone")
CODE_OF_DEVICE_TYPE: dict[str, int] = {name: code for code, name in enumerate(_DEVICE_TYPES)}
OTHER_DEVICE = 99
NO_DEVICE = 0


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
