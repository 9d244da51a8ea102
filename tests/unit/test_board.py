"""The verdict board on a real (in-process) torch store: first writer wins, acknowledgements count once, the
host lingers just long enough."""

from __future__ import annotations

import threading
import time

import pytest
from torch.distributed import HashStore

from distinit._board import Board, text


def _boards(world_size: int) -> list[Board]:
    store = HashStore()
    return [Board(store, "ns/g0/state", rank=r, world_size=world_size) for r in range(world_size)]


def test_first_writer_wins_and_every_rank_reads_it() -> None:
    first, second, third = _boards(3)
    assert third.read() is None
    assert first.publish("duplicate rank 1") == "duplicate rank 1"
    assert second.publish("world size 4 != 3") == "duplicate rank 1"
    assert third.read() == "duplicate rank 1"


def test_acknowledge_counts_each_rank_once() -> None:
    boards = _boards(3)
    boards[0].acknowledge()
    boards[0].acknowledge()
    boards[2].acknowledge()
    assert boards[1].seen() == 2


def test_linger_ends_when_every_rank_acknowledged() -> None:
    host, peer = _boards(2)
    host.acknowledge()
    reader = threading.Timer(0.2, peer.acknowledge)
    reader.start()
    started = time.monotonic()
    host.linger(bound=30.0)
    reader.join(10)
    assert host.seen() == 2 and time.monotonic() - started < 20.0


def test_linger_is_bounded_when_a_rank_never_reads() -> None:
    host, _ = _boards(2)
    started = time.monotonic()
    host.linger(bound=0.3)
    assert 0.25 <= time.monotonic() - started < 10.0


def test_linger_leaves_after_a_quiet_spell_once_settled() -> None:
    host, _, _ = _boards(3)
    host.acknowledge()
    started = time.monotonic()
    host.linger(bound=60.0, settled=lambda seen: seen >= 1, quiet=0.2)
    assert time.monotonic() - started < 30.0


def test_linger_ends_when_the_store_fails() -> None:
    class Gone:
        def add(self, key: str, value: int) -> int:
            raise RuntimeError("Connection closed by peer")

    started = time.monotonic()
    Board(Gone(), "k", rank=0, world_size=2).linger(bound=60.0)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(b"ok", "ok", id="bytes"),
        pytest.param("ok", "ok", id="str"),
        pytest.param(b"\xff-stray", "\ufffd-stray", id="stray-byte"),
    ],
)
def test_text(value: bytes | str, expected: str) -> None:
    assert text(value) == expected
