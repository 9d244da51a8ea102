"""distinit's torch seam (``distinit._torch``): each private torch name missing gives the public fallback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from distinit import _torch


def test_foreach_copy_without_torch_s_foreach_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_foreach_copy_")
    dst, src = [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.full((3,), 2.0)]
    _torch.foreach_copy(dst, src)
    assert dst[0].tolist() == [1.0, 1.0] and dst[1].tolist() == [2.0, 2.0, 2.0]


def test_foreach_copy_with_torch_s_kernel() -> None:
    dst, src = [torch.zeros(2)], [torch.ones(2)]
    _torch.foreach_copy(dst, src)
    assert dst[0].tolist() == [1.0, 1.0]


def test_own_tensors_without_the_private_dicts() -> None:
    linear = torch.nn.Linear(2, 2)
    params, buffers = _torch.own_tensors(linear)
    assert list(params) == ["weight", "bias"] and not buffers
    public = SimpleNamespace(
        named_parameters=linear.named_parameters, named_buffers=linear.named_buffers
    )  # no _parameters/_buffers
    params, buffers = _torch.own_tensors(public)  # type: ignore[arg-type]
    assert list(params) == ["weight", "bias"] and not buffers


def test_group_internals_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dist.distributed_c10d, "_set_pg_timeout", raising=False)
    monkeypatch.delattr(dist.distributed_c10d, "_world", raising=False)
    monkeypatch.delattr(dist.distributed_c10d, "_get_default_store", raising=False)
    assert _torch.pg_timeout_setter() is None
    assert _torch.reset_group_counter() is False
    assert _torch.default_store() is None


def test_no_default_store_without_a_group() -> None:
    assert not dist.is_initialized() and _torch.default_store() is None


def test_group_counter_reset_only_when_no_group_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    world = SimpleNamespace(group_count=1, pg_map={})
    monkeypatch.setattr(dist.distributed_c10d, "_world", world)
    assert _torch.reset_group_counter() is True and world.group_count == 0
    world.pg_map = {"pg": object()}
    world.group_count = 1
    assert _torch.reset_group_counter() is False and world.group_count == 1
