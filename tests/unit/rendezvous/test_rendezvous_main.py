"""``python -m distinit.rendezvous``: the backend registered in torch's registry, then torchrun's main."""

from __future__ import annotations

import pytest
import torch.distributed.run
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

from distinit.rendezvous import __main__ as entry
from distinit.rendezvous import create_handler


def test_registers_the_backend_then_runs_torchrun_with_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def fake_torchrun(args: list[str] | None = None) -> None:
        # On torch < 2.5 nothing else registered it: the registry must hold distinit's creator by now.
        seen.append((args, rendezvous_handler_registry._registry.get("distinit")))

    monkeypatch.setattr(torch.distributed.run, "main", fake_torchrun)
    monkeypatch.delitem(rendezvous_handler_registry._registry, "distinit", raising=False)
    entry.main(["--nnodes=2", "--rdzv-backend=distinit", "train.py"])
    assert seen == [(["--nnodes=2", "--rdzv-backend=distinit", "train.py"], create_handler)]


def test_running_it_where_the_entry_point_registered_it_already_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed.run, "main", lambda args=None: None)
    rendezvous_handler_registry.register("distinit", create_handler)  # what torch >= 2.5's entry point does
    entry.main([])  # the same creator twice: torch accepts it
    assert rendezvous_handler_registry._registry["distinit"] is create_handler
