"""Rank 0's see-off (``Liveness.stop(see_off=...)``) on torch's in-process HashStore: what it waits for."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from torch.distributed import HashStore

from distinit.init._liveness import BYE, Liveness

pytestmark = pytest.mark.timeout(20)


def _rank0(store: HashStore, world_size: int = 3) -> Liveness:
    store.set_timeout(timedelta(seconds=60))  # a blocking get of a missing key would outlive the test's limit
    return Liveness(store, rank=0, world_size=world_size, beat=0.04, stale=1.0)


def test_a_rank_0_whose_watch_never_beat_leaves_at_once() -> None:
    # No beat/0 (the watch failed before its first beat): a get of it waited out the store's timeout (60 s here,
    # the group's timeout in a job) at exit.
    liveness = _rank0(HashStore())
    done = threading.Event()
    threading.Thread(target=lambda: (liveness.stop(see_off=30.0), done.set()), daemon=True).start()
    assert done.wait(10), "stop() waits on a beat rank 0 never wrote"


def test_ranks_that_said_bye_or_acknowledged_are_not_waited_for() -> None:
    store = HashStore()
    store.set("beat/0", BYE)
    store.set("beat/1", BYE)  # left through teardown() itself
    store.set("beat/2", "7|1.0")
    store.set("byeseen/2", "1")  # its watch read rank 0's bye
    _rank0(store).stop(see_off=30.0)


def test_rank_0_waits_for_a_beating_rank_to_read_its_bye() -> None:
    store = HashStore()
    store.set("beat/0", BYE)
    store.set("beat/1", "7|1.0")
    store.set("beat/2", BYE)
    liveness = _rank0(store)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (liveness.stop(see_off=30.0), done.set()))
    waiter.start()
    assert not done.wait(0.3)  # several polls: still waiting for rank 1
    store.set("byeseen/1", "1")
    assert done.wait(10)
    waiter.join()


def test_rank_0_leaves_after_its_bound_when_a_rank_never_reads(caplog: pytest.LogCaptureFixture) -> None:
    store = HashStore()
    store.set("beat/0", BYE)
    store.set("beat/1", "7|1.0")
    store.set("who/1", "elsewhere|42")
    with caplog.at_level("INFO", logger="distinit"):
        _rank0(store, world_size=2).stop(see_off=0.2)
    assert "not having read that it leaves" in caplog.text and "rank 1 (host elsewhere, pid 42)" in caplog.text


def test_a_rank_0_holding_a_finding_does_not_see_off() -> None:
    # Its finding was lingered on already (the ranks acknowledged the finding, not the bye).
    store = HashStore()
    store.set("beat/0", BYE)
    store.set("beat/1", "7|1.0")
    liveness = _rank0(store, world_size=2)
    liveness.finding = "rank 1 (host a, pid 1): its process is gone"
    liveness.stop(see_off=30.0)
