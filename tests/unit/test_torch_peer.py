"""``_torch.peer``: group-local ranks as keywords every supported torch takes (group_src arrived in torch 2.6)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from distinit import _torch


@pytest.fixture(autouse=True)
def _fresh_detection() -> Iterator[None]:
    _torch._takes.cache_clear()
    yield
    _torch._takes.cache_clear()


def _old_broadcast(tensor: object, src: int | None = None, group: object = None, async_op: bool = False) -> None:
    """torch 2.4's signature: a global ``src``, no ``group_src``."""


def test_a_torch_with_group_src_gets_the_group_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    def new_broadcast(
        tensor: object, src: int | None = None, group: object = None, group_src: int | None = None
    ) -> None:
        """torch >= 2.6."""

    monkeypatch.setattr(dist, "broadcast", new_broadcast)
    assert _torch.peer("broadcast", "src", 3, object()) == {"group_src": 3}


def test_an_older_torch_gets_the_global_rank_of_the_group_s_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    group = object()
    monkeypatch.setattr(dist, "broadcast", _old_broadcast)
    monkeypatch.setattr(dist, "get_global_rank", lambda g, r: {(group, 1): 5}[(g, r)])
    assert _torch.peer("broadcast", "src", 1, group) == {"src": 5}
    assert _torch.peer("broadcast", "src", 1, None) == {"src": 1}  # the default group's ranks are global


def test_the_point_to_point_calls_are_detected_each_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_isend(tensor: object, dst: int | None = None, group: object = None, tag: int = 0) -> None:
        """torch 2.4's isend."""

    monkeypatch.setattr(dist, "isend", old_isend)
    assert _torch.peer("isend", "dst", 2, None) == {"dst": 2}


def test_a_function_without_a_readable_signature_falls_back_to_global_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dist, "irecv")
    assert _torch.peer("irecv", "src", 0, None) == {"src": 0}


def test_this_torch_is_read_as_it_is() -> None:
    import inspect

    expected = "group_src" in inspect.signature(dist.broadcast).parameters
    assert ("group_src" in _torch.peer("broadcast", "src", 0, None)) is expected
