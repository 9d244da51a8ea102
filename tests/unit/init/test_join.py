"""Pure tests of the join's waiting load: the interval formula, the growing poll, and who scans for the missing.

The store is torch's in-process ``HashStore`` behind a proxy that counts every key read, so "only rank 0 scans"
is checked as store traffic, not as which function ran.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import pytest
from torch.distributed import HashStore, Store

from distinit.errors import MalformedEnvError
from distinit.init._join import (
    Claimant,
    JoinProtocol,
    Keys,
    PauseSchedule,
    decode_ranks,
    encode_ranks,
    wait_for_key,
)
from distinit.init._policy import (
    FIRST_POLL,
    LOSS_BOUND_VARIABLE,
    POLL,
    QUICK_POLLS,
    QUICK_WORLD,
    STALE,
    Pace,
    load_scale,
    loss_bound,
)


class CountingStore:
    """Forwards to a HashStore and counts the keys each read touches (``check``, ``get``, ``multi_get``,
    ``add(key, 0)``); ``waits`` counts blocking ``wait`` calls, which the join must not make."""

    def __init__(self) -> None:
        self.inner = HashStore()
        self.reads: Counter[str] = Counter()
        self.waits = 0

    def check(self, keys: list[str]) -> bool:
        self.reads.update(keys)
        return bool(self.inner.check(keys))

    def get(self, key: str) -> bytes:
        self.reads[key] += 1
        return bytes(self.inner.get(key))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.reads.update(keys)
        return list(self.inner.multi_get(keys))

    def add(self, key: str, value: int) -> int:
        if value == 0:
            self.reads[key] += 1
        return int(self.inner.add(key, value))

    def wait(self, *args: Any) -> None:
        self.waits += 1
        self.inner.wait(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _protocol(store: CountingStore, rank: int, world_size: int) -> JoinProtocol:
    return JoinProtocol(
        cast(Store, store),
        namespace="t/",
        rank=rank,
        world_size=world_size,
        master="m:1",
        hosting=rank == 0,
        claimant=Claimant(host="sim", pid=10_000 + rank, nonce=f"n{rank}"),
    )


@pytest.fixture
def joined() -> Iterator[tuple[CountingStore, dict[int, JoinProtocol]]]:
    """World 64: ranks 0-7 and 40 have entered generation 0 (their heartbeats stopped on teardown)."""
    store = CountingStore()
    joins = {r: _protocol(store, r, 64) for r in (*range(8), 40)}
    for join in joins.values():
        join.enter(0)
    yield store, joins
    for join in joins.values():
        join.stop_beating()


MISSING = [r for r in range(64) if r >= 8 and r != 40]


# -------------------------------------------------------------------------------------------- the formula
@pytest.mark.parametrize(
    ("world_size", "poll", "beat", "stale"),
    [
        pytest.param(1, 0.25, 1.0, 5.0, id="world-1"),
        pytest.param(4, 0.25, 1.0, 5.0, id="world-4"),
        pytest.param(1000, 0.25, 1.0, 5.0, id="world-1000-last-at-base"),
        pytest.param(2000, 0.5, 2.0, 10.0, id="world-2000-twice"),
        pytest.param(4096, 1.024, 4.096, 20.48, id="world-4096"),
        pytest.param(100_000, 25.0, 100.0, 500.0, id="world-100k"),
    ],
)
def test_intervals_grow_with_the_world_above_1000(world_size: int, poll: float, beat: float, stale: float) -> None:
    pace = Pace.for_world(world_size)
    assert (pace.poll, pace.beat, pace.stale) == pytest.approx((poll, beat, stale))


@pytest.mark.parametrize("world_size", [1000, 2048, 5000, 10_000, 100_000])
def test_waiting_load_on_the_store_stays_flat(world_size: int) -> None:
    """Each waiting rank: 1 poll per ``poll`` s, 1 beat write and 1 watch read per ``beat`` s."""
    pace = Pace.for_world(world_size)
    ops_per_s = world_size * (1 / pace.poll + 2 / pace.beat)
    assert ops_per_s == pytest.approx(6000.0)


@pytest.mark.parametrize("world_size", [2, 64, 1000])
def test_small_worlds_name_a_lost_rank_within_about_10_s(world_size: int) -> None:
    pace = Pace.for_world(world_size)
    assert pace.stale == STALE and pace.stale + pace.beat <= 10.0


@pytest.mark.parametrize("world_size", [1, 999, 1001, 4096, 100_000])
def test_staleness_is_at_least_five_beats(world_size: int) -> None:
    """A starved beat thread (thousands of ranks on a few cores) must miss five beats to count as lost."""
    pace = Pace.for_world(world_size)
    assert pace.stale >= max(STALE, 5 * pace.beat)
    assert load_scale(world_size) == max(1.0, world_size / 1000)


@pytest.mark.parametrize("world_size", [0, -3])
def test_world_size_below_one_is_refused(world_size: int) -> None:
    with pytest.raises(ValueError, match="world_size"):
        Pace.for_world(world_size)


def test_pauses_start_in_milliseconds_and_double_to_the_poll() -> None:
    pauses = PauseSchedule(POLL)
    seen = [pauses.next() for _ in range(9)]
    assert seen[0] == pytest.approx(FIRST_POLL)
    assert seen[:6] == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16])
    assert seen[6:] == pytest.approx([POLL] * 3)


def test_a_small_world_polls_quickly_first_then_doubles() -> None:
    """World <= QUICK_WORLD: QUICK_POLLS pauses of 5 ms (a last rank arriving 10-40 ms late is seen within 5 ms),
    then the doubling; a larger world keeps the plain doubling (no extra checks on a busy store)."""
    small = Pace.for_world(2)
    pauses = PauseSchedule(small.poll, small.quick)
    seen = [pauses.next() for _ in range(QUICK_POLLS + 3)]
    assert seen[:QUICK_POLLS] == pytest.approx([FIRST_POLL] * QUICK_POLLS)
    assert seen[QUICK_POLLS:] == pytest.approx([0.01, 0.02, 0.04])
    assert Pace.for_world(QUICK_WORLD).quick == QUICK_POLLS
    assert Pace.for_world(QUICK_WORLD + 1).quick == 1


def test_a_large_world_starts_its_pauses_later() -> None:
    big = PauseSchedule(Pace.for_world(4096).poll)
    assert big.next() == pytest.approx(FIRST_POLL * 4.096)


# -------------------------------------------------------------------------------------------- wait_for_key
def test_wait_for_key_polls_without_a_blocking_store_wait() -> None:
    """No store.wait (c10d logs "waitForInput ... timed out" for each one that times out); the key set
    during the third pause is seen at the next poll."""
    store = CountingStore()
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        if seconds > 0:
            pauses.append(seconds)
            if len(pauses) == 3:
                store.inner.set("k", "v")

    assert wait_for_key(cast(Store, store), "k", float("inf"), sleep=sleep)
    assert store.waits == 0
    assert pauses == pytest.approx([0.005, 0.01, 0.02])


def test_wait_for_key_ends_at_its_end_without_the_key() -> None:
    store = CountingStore()
    assert not wait_for_key(cast(Store, store), "never", 0.0, sleep=lambda s: None)
    assert store.waits == 0


# -------------------------------------------------------------------------------------------- who scans
def test_rank_0_follows_the_arrivals_and_publishes_the_missing_ranks(
    joined: tuple[CountingStore, dict[int, JoinProtocol]],
) -> None:
    store, joins = joined
    assert joins[0].missing(0) == MISSING
    assert decode_ranks(store.inner.get("t/g0/missing").decode(), 64) == MISSING
    store.reads.clear()
    assert joins[0].missing(0) == MISSING  # nothing new: the counter only, no order entry read again
    assert set(store.reads) == {"t/g0/joined"}


def test_other_ranks_read_one_key_whatever_the_world(joined: tuple[CountingStore, dict[int, JoinProtocol]]) -> None:
    store, joins = joined
    joins[0].missing(0)  # rank 0 publishes
    store.reads.clear()
    assert joins[5].missing(0) == MISSING
    assert set(store.reads) == {"t/g0/missing"}
    assert sum(store.reads.values()) <= 2  # check + get, not 2 keys per rank of the world


def test_other_ranks_read_the_arrival_order_once_when_rank_0_never_published() -> None:
    """Under an agent store rank 0 may be the missing one: then a rank reads the arrival order itself."""
    store = CountingStore()
    joins = [_protocol(store, r, 6) for r in (1, 2, 4)]
    try:
        for join in joins:
            join.enter(0)
        store.reads.clear()
        assert joins[0].missing(0) == [0, 3, 5]
        assert not any("claim/" in key for key in store.reads)  # no per-rank claim scan
        assert store.reads["t/g0/order/1"] == 2  # one check and one multi_get of the three entries
    finally:
        for join in joins:
            join.stop_beating()


def test_the_timeout_names_the_missing_ranks_on_every_rank(
    joined: tuple[CountingStore, dict[int, JoinProtocol]],
) -> None:
    from distinit.init._policy import AttemptFailed

    _, joins = joined
    for rank in (0, 7, 40):
        with pytest.raises(AttemptFailed) as caught:
            joins[rank].wait(0, 0.0, sleep=lambda s: None)
        assert caught.value.missing_ranks == tuple(MISSING)
        assert "9/64 ranks joined generation 0" in str(caught.value)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        pytest.param([], "", id="none"),
        pytest.param([3], "3", id="one"),
        pytest.param([2, 3, 4, 7], "2-4,7", id="range-and-single"),
        pytest.param([0, 2, 4], "0,2,4", id="no-runs"),
        pytest.param(list(range(1000, 4096)), "1000-4095", id="a-whole-tail"),
    ],
)
def test_missing_ranks_travel_as_ranges(ranks: list[int], text: str) -> None:
    assert encode_ranks(ranks) == text
    assert decode_ranks(text, 4096) == ranks


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("5-3", id="reversed"),
        pytest.param("1,1", id="repeated"),
        pytest.param("3,2", id="descending"),
        pytest.param("-1", id="negative"),
        pytest.param("0-4096", id="beyond-the-world"),
        pytest.param("x", id="not-a-number"),
        pytest.param("1-2-3", id="two-dashes"),
    ],
)
def test_malformed_missing_ranks_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"range of ranks|invalid literal"):
        decode_ranks(text, 4096)


def test_an_arrival_key_not_written_by_distinit_is_a_named_rendezvous_error() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from distinit.errors import RendezvousError
    from distinit.init._heartbeat import follow_arrivals

    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=2))
    store.add("p/joined", 2)
    store.set("p/order/1", "0")
    store.set("p/order/2", "rm -rf")
    known: list[int] = []
    with pytest.raises(RendezvousError, match=r"join key p/order/2 holds b'rm -rf', not a rank number"):
        follow_arrivals(store, Keys("p/"), known)
    assert known == []  # nothing from a store written by something else is trusted


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param(None, None, id="unset"),
        pytest.param("", None, id="empty"),
        pytest.param("30", 30.0, id="seconds"),
        pytest.param(" 7.5 ", 7.5, id="spaces"),
        pytest.param("abc", "error", id="word"),
        pytest.param("-1", "error", id="negative"),
        pytest.param("0", "error", id="zero"),
        pytest.param("nan", "error", id="nan"),
        pytest.param("inf", "error", id="inf"),
    ],
)
def test_loss_bound_variable(value: str | None, want: float | str | None) -> None:
    environ = {} if value is None else {LOSS_BOUND_VARIABLE: value}
    if want == "error":
        with pytest.raises(MalformedEnvError) as caught:
            loss_bound(environ)
        assert caught.value.variables == (LOSS_BOUND_VARIABLE,)
        return
    assert loss_bound(environ) == want


def test_loss_bound_only_raises_the_scaled_bound() -> None:
    assert Pace.for_world(4, loss_bound=30.0).stale == 30.0
    assert Pace.for_world(4, loss_bound=1.0).stale == Pace.for_world(4).stale == 5.0
    assert Pace.for_world(10_000, loss_bound=1.0).stale == Pace.for_world(10_000).stale


def test_the_key_layout_is_the_wire_format_byte_for_byte() -> None:
    """Ranks of one distinit version read each other's keys: the layout's strings never change within it."""
    keys = Keys("distinit/job/0/c1/g3/")
    spelled = [keys.claim(2), keys.beat(2), keys.order(5), keys.joined, keys.world_size, keys.missing, keys.state]
    assert spelled == [
        "distinit/job/0/c1/g3/claim/2",
        "distinit/job/0/c1/g3/beat/2",
        "distinit/job/0/c1/g3/order/5",
        "distinit/job/0/c1/g3/joined",
        "distinit/job/0/c1/g3/world_size",
        "distinit/job/0/c1/g3/missing",
        "distinit/job/0/c1/g3/state",
    ]
    assert (keys.init_verdict, keys.pg) == ("distinit/job/0/c1/g3/init_verdict", "distinit/job/0/c1/g3/pg")
    store = CountingStore()
    rank0, rank1 = _protocol(store, 0, 3), _protocol(store, 1, 3)
    try:
        generation = rank0.generation()
        rank1.enter(generation)
        rank0.enter(generation)
        assert rank0.missing(generation) == [2]  # rank 0 follows the arrivals and publishes the missing
    finally:
        rank0.stop_beating()
        rank1.stop_beating()
    assert rank0.keys(generation) == Keys("t/g0/")
    written = ["t/generation", "t/g0/world_size", "t/g0/claim/0", "t/g0/claim/1", "t/g0/beat/0", "t/g0/beat/1"]
    written += ["t/g0/joined", "t/g0/order/1", "t/g0/order/2", "t/g0/missing"]
    assert all(store.inner.check([key]) for key in written), [k for k in written if not store.inner.check([k])]
    assert not store.inner.check(["t/g0/state"])  # rank 2 never came
    assert [bytes(store.inner.get(k)) for k in ("t/g0/order/1", "t/g0/order/2", "t/g0/missing")] == [b"1", b"0", b"2"]
    assert bytes(store.inner.get("t/g0/claim/1")) == b"sim|10001|n1"
