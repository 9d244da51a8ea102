"""``_group.py`` and the public face: the exported names, the group a call needs, ``timeout=`` (no group formed)."""

from datetime import timedelta

import pytest
import torch

import distinit.broadcast
from distinit.broadcast import broadcast_module, broadcast_object, broadcast_state_dict, broadcast_tensor
from distinit.broadcast._group import GroupFacts
from distinit.broadcast._header import OP_TENSOR


def test_public_names() -> None:
    assert sorted(distinit.broadcast.__all__) == [
        "broadcast_module",
        "broadcast_object",
        "broadcast_state_dict",
        "broadcast_tensor",
        "flatten_module_",
    ]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: broadcast_tensor(torch.zeros(1)), id="tensor"),
        pytest.param(lambda: broadcast_object(1, type=int), id="object"),
        pytest.param(lambda: broadcast_state_dict({}), id="state_dict"),
        pytest.param(lambda: broadcast_module(torch.nn.Linear(1, 1)), id="module"),
    ],
)
def test_needs_an_initialised_process_group(call: object) -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        call()  # type: ignore[operator]


def _facts() -> GroupFacts:
    return GroupFacts(torch.nn.Module(), size=1, rank=0, global_rank=0, device=torch.device("cpu"))


@pytest.mark.parametrize("timeout", [0, -1.0, timedelta(seconds=0), float("nan"), float("inf")])
def test_timeout_must_be_positive_and_finite(timeout: float | timedelta) -> None:
    facts = _facts()
    with pytest.raises(ValueError, match="timeout must be"):
        facts.next_call(op=OP_TENSOR, src=0, timeout=timeout)
    assert facts.seq == 0  # a refused call is not counted: the ranks stay in step


@pytest.mark.parametrize("timeout", ["3", True, [1]])
def test_timeout_of_another_type_is_a_type_error_naming_it(timeout: object) -> None:
    with pytest.raises(TypeError, match=r"^timeout must be a number of seconds"):
        _facts().next_call(op=OP_TENSOR, src=0, timeout=timeout)  # type: ignore[arg-type]


def test_a_huge_timeout_never_overflows_the_native_wait() -> None:
    ctx = _facts().next_call(op=OP_TENSOR, src=0, timeout=1e300)
    assert ctx.wait_for is not None and ctx.wait_for.days >= 365
    assert (ctx.seq, ctx.call, ctx.src) == (1, "broadcast_tensor", 0)
