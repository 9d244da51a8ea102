"""``_transport/file.py``: its header parser against hostile documents (issue 23 item 5): never trusted."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from distinit.broadcast._group import GroupFacts
from distinit.broadcast._header import OP_TENSOR
from distinit.broadcast._transport import file as _file
from distinit.broadcast._transport.pack import Route, slots

SPEC = [(torch.float32, (2, 3)), (torch.int8, (5,))]
ROUTE = Route("file", ((0, 1),), "0123abcd")


@pytest.fixture(scope="module")
def ctx() -> Any:
    facts = GroupFacts(torch.nn.Module(), size=2, rank=1, global_rank=1, device=torch.device("cpu"))
    return facts.next_call(op=OP_TENSOR, src=0, timeout=None)


def _honest(ctx: Any) -> dict[str, Any]:
    raw, _ = _file._header(ctx, ROUTE, SPEC, ["a", "b"], 0x1234)
    doc: dict[str, Any] = json.loads(raw)
    return doc


def _parse(ctx: Any, raw: bytes) -> dict[str, Any] | None:
    offsets, total = slots(SPEC)
    return _file.parse_header(raw, ctx, ROUTE, SPEC, offsets, total)


def test_the_honest_header_parses(ctx: Any) -> None:
    assert _parse(ctx, json.dumps(_honest(ctx)).encode()) == _honest(ctx)


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda d: b"[" * 200_000 + b"]" * 200_000, id="nested-200000-deep-list"),
        pytest.param(lambda d: b'{"a":' * 100_000 + b"1" + b"}" * 100_000, id="nested-100000-deep-dict"),
        pytest.param(lambda d: b"\xff\xfe not json", id="not-json"),
        pytest.param(lambda d: b"[]", id="a-list"),
        pytest.param(lambda d: b"null", id="null"),
        pytest.param(lambda d: {**d, "tensors": {"a": 1}}, id="tensors-a-dict"),
        pytest.param(lambda d: {**d, "tensors": [*d["tensors"], d["tensors"][0]]}, id="one-tensor-too-many"),
        pytest.param(lambda d: {**d, "tensors": [[1, 2], *d["tensors"]]}, id="a-short-tensor-row"),
        pytest.param(lambda d: {**d, "data_offset": "64"}, id="data-offset-a-string"),
        pytest.param(lambda d: {**d, "data_offset": True}, id="data-offset-a-bool"),
        pytest.param(lambda d: {**d, "data_offset": -64}, id="data-offset-negative"),
        pytest.param(lambda d: {**d, "data_offset": d["data_offset"] + 1}, id="data-offset-unaligned"),
        pytest.param(lambda d: {**d, "crc32": 0x1234}, id="crc-an-int"),
        pytest.param(lambda d: {**d, "crc32": "1" * 10**5}, id="crc-huge"),
        pytest.param(lambda d: {**d, "version": True}, id="version-a-bool"),
        pytest.param(lambda d: {**d, "seq": 10**30}, id="seq-huge"),
        pytest.param(lambda d: {**d, "token": None}, id="token-null"),
        pytest.param(lambda d: {k: v for k, v in d.items() if k != "format"}, id="format-missing"),
    ],
)
def test_any_malformed_header_is_not_this_calls(ctx: Any, forge: Any) -> None:
    forged = forge(_honest(ctx))
    raw = forged if isinstance(forged, bytes) else json.dumps(forged).encode()
    assert _parse(ctx, raw) is None
