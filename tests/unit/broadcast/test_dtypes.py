import pytest
import torch

from distinit.broadcast._dtypes import (
    CODE_OF_DTYPE,
    DTYPE_OF_CODE,
    describe,
    device_type_code,
    device_type_name,
    dtype_code,
    dtype_name,
)


def test_codes_round_trip_and_are_unique() -> None:
    assert len(set(CODE_OF_DTYPE.values())) == len(CODE_OF_DTYPE)
    for dtype, code in CODE_OF_DTYPE.items():
        assert DTYPE_OF_CODE[code] is dtype
        assert dtype_name(code) == str(dtype).removeprefix("torch.")


@pytest.mark.parametrize(
    "dtype",
    [torch.bool, torch.bfloat16, torch.float8_e4m3fn, torch.int16, torch.uint16, torch.uint32, torch.uint64,
     torch.complex64, torch.complex128],
)  # fmt: skip
def test_dtypes_gloo_rejects_have_codes(dtype: torch.dtype) -> None:
    assert dtype_code(dtype) > 0


def test_quantized_dtype_has_no_code() -> None:
    assert dtype_code(torch.qint8) == -1


def test_describe_reads_like_user_code() -> None:
    assert describe(dtype_code(torch.float32), (1024, 768)) == "float32[1024, 768]"
    assert describe(dtype_code(torch.int64), ()) == "int64[]"
    assert dtype_name(999) == "<dtype code 999>"


def test_device_type_codes() -> None:
    assert device_type_name(device_type_code(torch.device("cpu"))) == "cpu"
    assert device_type_name(device_type_code(torch.device("meta"))) == "meta"
    assert device_type_code(torch.device("cpu")) != device_type_code(torch.device("meta"))
