"""init/_heartbeat.py's judgement of a silent rank, one turn at a time, on torch's in-process HashStore.

:meth:`Heartbeat.tick` is one turn of the heartbeat thread (beat, then watch); the tests call it directly with
a fake monotonic clock, so "unchanged for longer than the loss bound, by the watcher's own clock" is checked
without threads or sleeping. The thread itself is exercised in ``test_fail_fast.py``.
"""

from __future__ import annotations

from typing import cast

import pytest
from torch.distributed import HashStore, Store

from distinit.init._heartbeat import Heartbeat, Silent
from distinit.init._join import Keys

KEYS = Keys("ns/g0/")
STALE = 5.0


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _joined(store: HashStore, rank: int, position: int, beat: str = "1|1700000000.000") -> None:
    """``rank`` joined ``position``-th, as the join writes it (its claim, its beat, the counter, the order)."""
    store.set(KEYS.claim(rank), f"host{rank}|{100 + rank}|n")
    store.set(KEYS.beat(rank), beat)
    store.add(KEYS.joined, 1)
    store.set(KEYS.order(position), str(rank))


def _watcher(store: HashStore, rank: int, clock: Clock) -> Heartbeat:
    return Heartbeat(cast(Store, store), keys=KEYS, rank=rank, lost=lambda s: None, beat=1.0, stale=STALE, clock=clock)


def _beat_every_second(heartbeat: Heartbeat, clock: Clock, seconds: int) -> list[Silent | None]:
    """``seconds`` turns, one a second on the fake clock (as the thread runs them)."""
    seen = []
    for _ in range(seconds):
        clock.now += 1.0
        seen.append(heartbeat.tick())
    return seen


def test_a_beat_unchanged_past_the_loss_bound_by_the_watchers_clock_is_silent() -> None:
    store, clock = HashStore(), Clock()
    _joined(store, 0, 1)
    _joined(store, 1, 2)
    watcher = _watcher(store, 0, clock)
    watcher.beat()
    # First sight at t+1; unchanged at t+6 is 5 s, not past the bound; t+7 is.
    assert _beat_every_second(watcher, clock, 5) == [None] * 5
    clock.now += 1.0
    assert watcher.tick() is None  # 5 s exactly: not yet past the bound
    clock.now += 1.0
    silent = watcher.tick()
    assert isinstance(silent, Silent) and silent.rank == 1
    assert silent.silent_for == pytest.approx(6.0)
    assert silent.last_wall == pytest.approx(1_700_000_000.0) and silent.last_seen() == "22:13:20 UTC"


def test_a_changing_beat_is_never_silent_however_long_the_watch() -> None:
    store, clock = HashStore(), Clock()
    _joined(store, 0, 1)
    _joined(store, 1, 2)
    watcher = _watcher(store, 0, clock)
    watcher.beat()
    for n in range(30):
        store.set(KEYS.beat(1), f"{n + 2}|1700000000.000")  # rank 1 beats once every 3 s: well inside the bound
        assert _beat_every_second(watcher, clock, 3) == [None, None, None]


def test_rank_0_watches_the_ranks_in_join_order_and_names_the_first_silent_one() -> None:
    store, clock = HashStore(), Clock()
    for position, rank in enumerate((0, 3, 1, 2), start=1):
        _joined(store, rank, position)
    watcher = _watcher(store, 0, clock)
    watcher.beat()
    seen = []
    for n in range(7):
        clock.now += 1.0
        store.set(KEYS.beat(3), f"{n + 2}|1700000001.000")  # rank 3 beats every second; ranks 1 and 2 stopped
        seen.append(watcher.tick())
    assert seen[:6] == [None] * 6
    assert seen[6] is not None and seen[6].rank == 1  # rank 3 is alive; rank 1 joined before rank 2


def test_a_silence_seen_while_the_watcher_itself_did_not_run_starts_afresh() -> None:
    """A watcher frozen for a while saw no beats then: that is no sign of the others (it is its own freeze)."""
    store, clock = HashStore(), Clock()
    _joined(store, 0, 1)
    _joined(store, 1, 2)
    watcher = _watcher(store, 0, clock)
    watcher.beat()
    watcher.tick()
    clock.now += STALE + 2.0  # the watcher did not run for 7 s (SIGSTOP, swap): its own beat stopped too
    assert watcher.tick() is None  # rank 1's silence is counted from now, not from before the freeze
    assert watcher.frozen_for() == pytest.approx(STALE + 2.0)  # kept: the others declared this rank lost
    assert _beat_every_second(watcher, clock, 5) == [None] * 5
    clock.now += 1.0
    late = watcher.tick()
    assert late is not None and late.rank == 1 and late.silent_for == pytest.approx(6.0)


def test_a_gap_under_half_the_bound_is_no_freeze_and_keeps_the_count() -> None:
    store, clock = HashStore(), Clock()
    _joined(store, 0, 1)
    _joined(store, 1, 2)
    watcher = _watcher(store, 0, clock)
    watcher.beat()
    watcher.tick()
    clock.now += STALE / 2  # exactly half: still no freeze
    assert watcher.tick() is None
    clock.now += 2.0
    assert watcher.tick() is None
    clock.now += 1.0
    silent = watcher.tick()
    assert silent is not None and silent.rank == 1  # the count kept running across the gaps
    assert silent.silent_for == pytest.approx(STALE + 0.5) and watcher.frozen_for() is None


def test_another_rank_watches_rank_0_only_once_it_beats_and_learns_its_claim() -> None:
    store, clock = HashStore(), Clock()
    _joined(store, 2, 1)
    watcher = _watcher(store, 2, clock)
    watcher.beat()
    assert _beat_every_second(watcher, clock, 10) == [None] * 10  # rank 0 never came: not watched, never silent
    assert watcher.host_claim is None
    _joined(store, 0, 2)
    assert watcher.tick() is None
    assert watcher.host_claim == "host0|100|n"
    _joined(store, 1, 3)  # a rank other than 0 is not this watcher's to watch
    assert _beat_every_second(watcher, clock, 5) == [None] * 5
    clock.now += 1.0
    silent = watcher.tick()
    assert silent is not None and silent.rank == 0


def test_each_turn_writes_a_new_beat_that_the_watchers_see_change() -> None:
    store, clock = HashStore(), Clock()
    beating = _watcher(store, 1, clock)
    beating.beat()
    first = bytes(store.get(KEYS.beat(1)))
    clock.now += 1.0
    beating.tick()
    second = bytes(store.get(KEYS.beat(1)))
    assert first.startswith(b"1|") and second.startswith(b"2|") and beating.last_beat == clock.now


def test_an_unreadable_wall_clock_is_unknown_not_an_error() -> None:
    store, clock = HashStore(), Clock()
    _joined(store, 0, 1)
    _joined(store, 1, 2, beat="7|not-a-time")
    watcher = _watcher(store, 0, clock)
    watcher.beat()
    silent = _beat_every_second(watcher, clock, 7)[-1]
    assert silent is not None and silent.last_wall is None and silent.last_seen() == "unknown"
