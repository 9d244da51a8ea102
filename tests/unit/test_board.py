"""The verdict board on a real (in-process) torch store: first writer wins, acknowledgements count once, the
host lingers just long enough."""

from __future__ import annotations

import time
from collections.abc import Callable

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


def test_acknowledged_is_by_rank_not_by_count() -> None:
    # two acknowledgements, but not from the rank the host waits for: a consequence that read and left does
    # not stand in for a rank still blocked in its collective
    boards = _boards(4)
    boards[0].acknowledge()
    boards[2].acknowledge()
    assert boards[0].seen() == 2
    assert not boards[0].acknowledged([0, 3])
    assert boards[0].acknowledged([0, 2]) and boards[0].acknowledged([])
    boards[3].acknowledge()
    assert boards[0].acknowledged([0, 3])


def test_a_junk_value_is_replaced_only_while_it_is_still_there() -> None:
    first, second = _boards(2)
    assert first.publish("\x00junk") == "\x00junk"
    assert first.replace("\x00junk", "rank 1 (host h, pid 9): gone") == "rank 1 (host h, pid 9): gone"
    assert second.replace("\x00junk", "unknown: later") == "rank 1 (host h, pid 9): gone"  # changed meanwhile


class _Recorded:
    """A real store whose reads of the acknowledgement count are logged, with a hook run before each."""

    def __init__(self, before_read: Callable[[int], None] = lambda n: None) -> None:
        self.store = HashStore()
        self.log: list[tuple[str, int]] = []
        self.before_read = before_read

    def add(self, key: str, value: int, /) -> int:
        if key.endswith("/seen") and value == 0:
            self.before_read(sum(1 for event, _ in self.log if event == "read"))
            seen = self.store.add(key, 0)
            self.log.append(("read", seen))
            return seen
        return self.store.add(key, value)

    def check(self, keys: list[str], /) -> bool:
        return self.store.check(keys)

    def get(self, key: str, /) -> bytes:
        return self.store.get(key)

    def compare_set(self, key: str, expected: str, desired: str, /) -> bytes:
        return self.store.compare_set(key, expected, desired)


def test_linger_ends_when_every_rank_acknowledged() -> None:
    # The peer acknowledges just before the host's third read: the host must leave on that read, not poll on.
    store = _Recorded(before_read=lambda reads: peer.acknowledge() if reads == 2 else None)
    host = Board(store, "k", rank=0, world_size=2)
    peer = Board(store, "k", rank=1, world_size=2)
    host.acknowledge()
    host.linger(bound=60.0)
    assert store.log == [("read", 1), ("read", 1), ("read", 2)]


def test_linger_is_bounded_when_a_rank_never_reads() -> None:
    host, _ = _boards(2)
    started = time.monotonic()
    host.linger(bound=0.3)
    assert 0.25 <= time.monotonic() - started < 10.0


def test_linger_leaves_after_a_quiet_spell_once_settled() -> None:
    # Once the count stayed still for `quiet` s, the host asks `settled`; it must leave on the first True.
    store = _Recorded()
    host = Board(store, "k", rank=0, world_size=3)
    host.acknowledge()
    answers = iter([False, False, True])
    asked: list[int] = []

    def settled(seen: int) -> bool:
        asked.append(seen)
        store.log.append(("settled", seen))
        return next(answers)

    host.linger(bound=60.0, settled=settled, quiet=0.2)
    assert asked == [1, 1, 1]
    assert store.log[-1] == ("settled", 1)  # no read after the first True: it left at once
    assert set(store.log) == {("read", 1), ("settled", 1)}


def test_linger_ends_when_the_store_fails() -> None:
    class Gone:
        reads = 0

        def add(self, key: str, value: int) -> int:
            Gone.reads += 1
            raise RuntimeError("Connection closed by peer")

    Board(Gone(), "k", rank=0, world_size=2).linger(bound=60.0)  # type: ignore[arg-type]
    assert Gone.reads == 1  # the first failed read ends the wait: nobody can read the store any more


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
