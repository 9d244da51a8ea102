from datetime import timedelta

import pytest
import torch

import distinit.broadcast
from distinit.broadcast import broadcast_module, broadcast_object, broadcast_state_dict, broadcast_tensor
from distinit.broadcast._group import resolve


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


@pytest.mark.parametrize("timeout", [0, -1.0, timedelta(seconds=0)])
def test_timeout_must_be_positive(timeout: float | timedelta) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        resolve(None, timeout)
