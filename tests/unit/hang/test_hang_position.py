"""Where a rank is: the sampler on real threads, and the published position's encoding (hostile values too)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.utils.store import barrier

from distinit.hang import Position, Sampler
from distinit.hang._position import MAX_BYTES, NO_OWN, beat_of, still_of


@contextmanager
def parked(target: Callable[[threading.Event], None]) -> Iterator[threading.Thread]:
    """A thread running ``target`` until the test ends (``target`` waits on the event it is given)."""
    done = threading.Event()
    thread = threading.Thread(target=target, args=(done,), daemon=True)
    thread.start()
    time.sleep(0.05)
    try:
        yield thread
    finally:
        done.set()
        thread.join(5)


def load_batch(done: threading.Event) -> None:
    done.wait(10)


def test_a_thread_in_its_own_code_is_named_by_function_and_line() -> None:
    with parked(load_batch) as thread:
        position = Sampler(dict, thread_id=thread.ident).sample()
    assert position is not None and position.kind == "code"
    assert position.op == "wait" and position.at.startswith("threading.py:")  # the innermost frame: the stdlib's
    assert position.own.startswith("load_batch at tests/unit/hang/test_hang_position.py:"), position
    assert position.place().endswith("(its own code)")


def in_torch_distributed(done: threading.Event) -> None:
    store = dist.HashStore()
    # torch's own store-based barrier, in distributed_c10d.py: a wait in torch's collective API, as a rank in a
    # collective is (nobody else comes; it times out after the test)
    with contextlib.suppress(Exception):
        dist.distributed_c10d._store_based_barrier(0, store, "g", 2, timedelta(seconds=1))


def in_fsdp_like_code(done: threading.Event) -> None:
    # elsewhere in torch.distributed (elastic's store helpers here): work, not a wait in a collective
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=1))
    with contextlib.suppress(Exception):
        barrier(store, world_size=2, key_prefix="x", barrier_timeout=1)


def test_a_thread_inside_torch_distributed_is_in_a_collective_at_its_call_site() -> None:
    with parked(in_torch_distributed) as thread:
        position = Sampler(lambda: {"world": 7}, thread_id=thread.ident).sample()
    assert position is not None and position.kind == "collective"
    assert position.at.startswith("tests/unit/hang/test_hang_position.py:"), position
    assert position.counts == {"world": 7} and position.op == "_store_based_barrier"


def test_other_torch_distributed_code_is_not_a_collective() -> None:
    with parked(in_fsdp_like_code) as thread:
        position = Sampler(dict, thread_id=thread.ident).sample()
    assert position is not None and position.kind == "code", position


def test_the_call_s_group_is_read_from_its_frame() -> None:
    names: list[object] = []

    def name(group: object) -> str:
        names.append(group)
        return "g7"

    with parked(in_torch_distributed) as thread:
        position = Sampler(dict, thread_id=thread.ident, group_name=name).sample(beat=9)
    # _store_based_barrier has no ``group`` argument: the group stays unknown, never guessed
    assert position is not None and position.group is None and names == [] and position.beat == 9


def test_still_grows_at_one_place_and_restarts_when_the_counts_move() -> None:
    counts = {"world": 1}
    clock = iter([0.0, 5.0, 12.0, 13.0]).__next__
    with parked(load_batch) as thread:
        sampler = Sampler(lambda: dict(counts), thread_id=thread.ident, clock=clock)
        assert [sampler.sample().still for _ in range(2)] == [0.0, 5.0]  # type: ignore[union-attr]
        counts["world"] = 2
        assert sampler.sample().still == 0.0  # type: ignore[union-attr]
        assert sampler.sample().still == 1.0  # type: ignore[union-attr]


def test_the_median_gap_between_collectives_is_known_after_five() -> None:
    counts = {"world": 0}
    now = [0.0]
    with parked(load_batch) as thread:
        sampler = Sampler(lambda: dict(counts), thread_id=thread.ident, clock=lambda: now[0])
        gaps = []
        for step in range(7):
            counts["world"] = step
            now[0] = step * 3.0
            gaps.append(sampler.sample().gap)  # type: ignore[union-attr]
    assert gaps[:5] == [None] * 5 and gaps[5:] == [3.0, 3.0]


def test_a_gone_thread_has_no_position() -> None:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    assert Sampler(dict, thread_id=thread.ident).sample() is None


def test_positions_round_trip() -> None:
    position = Position("collective", "all_reduce", "train.py:88", counts={"world": 5, "3": 2}, still=12.34, gap=0.5)
    assert Position.parse(position.encode()) == Position(
        "collective", "all_reduce", "train.py:88", counts={"world": 5, "3": 2}, still=12.3, gap=0.5
    )
    assert Position.parse(Position("code", "f", "a.py:1", own=NO_OWN).encode()).place() == (  # type: ignore[union-attr]
        "f at a.py:1 (no frame of its own code)"
    )


@pytest.mark.parametrize(
    "junk",
    [
        b"",
        b"\xff\xfe",
        b"[" * 100_000,
        b"[" * 2000,
        b'{"k":"collective"}',
        b'{"k":"evil","op":"a","at":"b"}',
        b'{"k":"code","op":1,"at":"b","s":1}',
        b'{"k":"code","op":"a","at":"b","s":-1}',
        b'{"k":"code","op":"a","at":"b","s":1e99}',
        b'{"k":"code","op":"a","at":"b","s":true}',
        b'{"k":"code","op":"a","at":"b","s":1,"n":{"world":-3}}',
        b'{"k":"code","op":"a","at":"b","s":1,"n":{"world":1.5}}',
        b'{"k":"code","op":"a","at":"b","s":1,"g":"x"}',
        json.dumps({"k": "code", "op": "a" * MAX_BYTES, "at": "b", "s": 1}).encode(),
    ],
)
def test_anything_else_on_the_key_is_no_position(junk: bytes) -> None:
    assert Position.parse(junk) is None


def test_still_is_read_from_the_first_field_alone() -> None:
    assert still_of(Position("code", "f", "a.py:1", still=12.34).encode().encode()) == 12.3
    junk = (b"", b"junk", b'{"s":', b'{"s":nan,', b'{"s":-4,', b'{"s":1e99,', b'{"s":' + b"9" * 100, b'{"k":1,"s":5}')
    for value in junk:
        assert still_of(value) == 0.0, value


def test_the_beat_number_is_read_from_the_second_field_alone() -> None:
    assert beat_of(Position("code", "f", "a.py:1", still=1.0, beat=4242).encode().encode()) == 4242
    for junk in (
        b"",
        b'{"s":1.0,"b":-1,',
        b'{"s":1.0,"b":"x",',
        b'{"s":1.0,"k":1,"b":5}',
        b'{"s":1.0,"b":' + b"9" * 40,
    ):
        assert beat_of(junk) is None, junk
