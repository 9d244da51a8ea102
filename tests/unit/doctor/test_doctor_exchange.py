"""The doctor's gathers hold their works until the group is destroyed (torch 2.4.1's gloo destroy deadlock).

Pure: a failing destroy still lets go; the gathers on a real gloo group are in
``tests/integration/doctor/test_doctor_exchange_socket.py``.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distinit.doctor import _exchange


@pytest.mark.timeout(60)
def test_destroy_world_lets_go_even_when_the_destroy_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_exchange, "_held", [object()])

    def broken() -> None:
        raise RuntimeError("no group")

    monkeypatch.setattr(dist, "destroy_process_group", broken)
    with pytest.raises(RuntimeError, match="no group"):
        _exchange.destroy_world()
    assert _exchange._held == []
