"""Pure pre-flight checks (no process group, no network traffic)."""

from __future__ import annotations

import pytest

from distinit.errors import IncompleteEnvError, MalformedEnvError, RendezvousError, WorldSizeMismatchError
from distinit.init import _loopback


@pytest.mark.parametrize(("rank", "world_size"), [(2, 2), (5, 4)])
def test_rank_out_of_range(rank: int, world_size: int) -> None:
    with pytest.raises(WorldSizeMismatchError) as caught:
        _loopback.check_world(rank=rank, world_size=world_size)
    assert caught.value.ranks == (rank,)


def test_master_required_beyond_one_rank() -> None:
    _loopback.check_master(master_addr=None, master_port=None, world_size=1, rank=0)
    with pytest.raises(IncompleteEnvError) as caught:
        _loopback.check_master(master_addr=None, master_port=29500, world_size=2, rank=1)
    assert caught.value.variables == ("MASTER_ADDR",)


def test_port_range() -> None:
    with pytest.raises(MalformedEnvError, match="MASTER_PORT=70000"):
        _loopback.check_master(master_addr="h", master_port=70000, world_size=2, rank=0)


def test_interfaces() -> None:
    _loopback.check_interfaces("gloo", {"GLOO_SOCKET_IFNAME": "lo"}, rank=0)
    _loopback.check_interfaces("nccl", {"NCCL_SOCKET_IFNAME": "^docker,lo"}, rank=0)
    with pytest.raises(RendezvousError, match="GLOO_SOCKET_IFNAME='bogus0'") as caught:
        _loopback.check_interfaces("gloo", {"GLOO_SOCKET_IFNAME": "bogus0"}, rank=3)
    assert "lo" in caught.value.what and caught.value.rank == 3


def test_backend_unavailable_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: NCCL is a valid backend")
    with pytest.raises(RendezvousError, match="backend 'nccl' is not available"):
        _loopback.check_backend("nccl", rank=0)
    _loopback.check_backend("gloo", rank=0)


def test_no_existing_group() -> None:
    assert _loopback.check_existing(backend="gloo", rank=0, world_size=1) is False
