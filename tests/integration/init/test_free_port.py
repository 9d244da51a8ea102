"""``free_port``: tests side by side under pytest-xdist never pick the same port, and never an ephemeral one."""

from __future__ import annotations

import socket

import init_launch
import pytest


@pytest.mark.parametrize(("worker", "first"), [("gw0", 10000), ("gw2", 11200), ("gw7", 14200), ("master", 10000)])
def test_each_worker_walks_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch, worker: str, first: int) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    ports = [init_launch.free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # picked but not yet bound: still distinct
    assert all(first <= port < first + init_launch.PORTS_PER_WORKER for port in ports), ports


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    nxt = init_launch.free_port() + 1  # the walk goes on from here (wrapping inside the slice)
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", nxt))
        except OSError:
            pytest.skip(f"port {nxt} is taken by something else on this machine")
        assert init_launch.free_port() != nxt
