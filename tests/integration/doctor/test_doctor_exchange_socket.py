"""The doctor's gathers hold their works until the group is destroyed (torch 2.4.1's gloo destroy deadlock).

Binds a socket for a free port and forms a real one-rank gloo group (its TCPStore listens on that port);
the pure half is in ``tests/unit/doctor/test_doctor_exchange.py``.
"""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from distinit.doctor import _exchange


@pytest.fixture
def one_rank_group() -> None:
    with socket.socket() as sock:  # a free port for a one-rank world
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("one_rank_group")
def test_gathers_are_held_until_destroy_world_then_let_go() -> None:
    try:
        assert _exchange.gather_json({"rank": 0}, world_size=1, timeout=10) == [{"rank": 0}]
        # A gloo worker thread must never drop the last reference to a gather's tensors: each work and its
        # tensors stay held while the group lives (two collectives per gather).
        assert len(_exchange._held) == 2
        assert all(isinstance(item, tuple) and len(item) == 3 for item in _exchange._held)
    finally:
        _exchange.destroy_world()
    assert not dist.is_initialized()
    assert _exchange._held == []
