"""The large-group header (one all_reduce of a digest, issue 16) forced on small real gloo worlds.

``DISTINIT_BROADCAST_DIGEST_FROM=2`` makes worlds of 2 and more take the path groups of 64 ranks take by
default. Each case runs the existing round trips, mismatch matrices and forged headers of the row path's
tests, and checks three things: the results are the same; agreeing calls never exchange rows (one
all_reduce only); a disagreement falls back to the row exchange exactly once and raises, on every rank,
the very message the row path raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import test_hostile as hostile
import test_object as objects
import test_state_dict as state_dicts
import test_tensor as tensors
import torch

from distinit.testing import DistWorld

DIGEST = {"DISTINIT_BROADCAST_DIGEST_FROM": "2"}


def counting(fn: Callable[..., Any], *args: Any) -> tuple[Any, int, int]:
    """``fn(*args)`` on this rank, with how many digest all_reduces and row exchanges its calls made."""
    from distinit.broadcast import _digest, _header

    real_agree, real_exchange = _digest.agree, _header.exchange
    counts = {"digest": 0, "rows": 0}

    def agree(*a: Any, **kw: Any) -> Any:
        counts["digest"] += 1
        return real_agree(*a, **kw)

    def exchange(*a: Any, **kw: Any) -> Any:
        counts["rows"] += 1
        return real_exchange(*a, **kw)

    _digest.agree, _header.exchange = agree, exchange  # type: ignore[assignment]
    try:
        result = fn(*args)
    finally:
        _digest.agree, _header.exchange = real_agree, real_exchange  # type: ignore[assignment]
    return result, counts["digest"], counts["rows"]


def _on_digest_path(dist_world: DistWorld, fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    per_rank = dist_world(counting, world_size=world_size, timeout=75, args=(fn, *args), env=DIGEST)
    assert all(digests > 0 for _, digests, _ in per_rank), "the digest path did not run"
    return per_rank


ROUND_TRIPS = [
    pytest.param(tensors.round_trip_every_dtype, 3, [[]] * 3, id="tensor-every-dtype-world-3"),
    pytest.param(objects.round_trips, 4, [[]] * 4, id="object-world-4"),
    pytest.param(state_dicts.state_dict_round_trips, 3, [[]] * 3, id="state-dict-world-3"),
    pytest.param(state_dicts.mixed_receivers, 3, [[]] * 3, id="state-dict-mixed-receivers-world-3"),
    pytest.param(state_dicts.module_sync, 4, [[]] * 4, id="module-world-4"),
    pytest.param(tensors.successive_small_calls_stay_independent, 3, [[]] * 3, id="successive-inline-calls"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fn", "world_size", "expected"), ROUND_TRIPS)
def test_round_trips_take_one_all_reduce_and_no_rows(
    dist_world: DistWorld, fn: Callable[[], Any], world_size: int, expected: list[Any]
) -> None:
    per_rank = _on_digest_path(dist_world, fn, world_size)
    assert [result for result, _, _ in per_rank] == expected
    assert [rows for _, _, rows in per_rank] == [0] * world_size  # every call agreed through the digest


@pytest.mark.timeout(120)
def test_flattened_modules_take_the_zero_copy_path_by_digest(dist_world: DistWorld) -> None:
    """The digest's "every rank is flattened" word drives the zero-copy choice as the rows did."""
    for result, _, rows in _on_digest_path(dist_world, state_dicts.flattened_module_sync, 3):
        assert result["all flattened"] == ([], True)
        assert result["one rank not flattened"] == []
        assert result["changed after flattening"] == []
        assert result["paths"] == [True, True, False, False]
        assert rows == 0


@pytest.mark.timeout(90)
def test_a_subgroup_reduces_among_its_own_ranks(dist_world: DistWorld) -> None:
    """The tree's steps use group-local ranks: a subgroup of global ranks 1 and 2 agrees without rank 0."""
    per_rank = dist_world(tensors.subgroup_with_group_local_src, world_size=3, timeout=45, env=DIGEST)
    assert per_rank == [[], [2.0, "src"], [2.0, "src"]]
    per_rank = dist_world(state_dicts.subgroup_state_dict, world_size=3, timeout=45, env=DIGEST)
    assert per_rank == [[7.0] * 3, [], [7.0] * 3]


def _without_times(per_rank: list[Any]) -> list[Any]:
    """A matrix's rows without their elapsed seconds (the last element of each case), per rank."""
    return [[case[:-1] for case in matrix] for matrix in per_rank]


@pytest.mark.timeout(150)
def test_the_tensor_mismatch_matrix_raises_the_row_paths_errors(dist_world: DistWorld) -> None:
    per_rank = _on_digest_path(dist_world, tensors.mismatch_matrix, 3)
    tensors._assert_same_verdicts_everywhere([matrix for matrix, _, _ in per_rank])
    assert [rows for _, _, rows in per_rank] == [len(tensors.EXPECTED_FIELD)] * 3  # one fallback per mismatch
    by_rows = dist_world(tensors.mismatch_matrix, world_size=3, timeout=45)
    assert _without_times([matrix for matrix, _, _ in per_rank]) == _without_times(by_rows)


@pytest.mark.timeout(150)
def test_the_object_and_state_dict_matrices_raise_the_row_paths_errors(dist_world: DistWorld) -> None:
    for fn in (objects.schema_mismatches, state_dicts.state_dict_mismatches):
        by_digest = [matrix for matrix, _, _ in _on_digest_path(dist_world, fn, 3)]
        by_rows = dist_world(fn, world_size=3, timeout=45)
        assert _without_times(by_digest) == _without_times(by_rows), fn.__name__
        assert all(case[1] not in {"no error", "no error|"} for case in by_digest[0]), by_digest[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flatten", [False, True], ids=["staged", "flattened"])
def test_a_module_structure_mismatch_names_the_tensor(dist_world: DistWorld, flatten: bool) -> None:
    per_rank = _on_digest_path(dist_world, state_dicts.module_mismatch, 3, flatten)
    assert {result for result, _, _ in per_rank} == set(dist_world(state_dicts.module_mismatch, 3, args=(flatten,)))
    field, text = per_rank[0][0]
    assert field == "metadata"
    assert "rank 1 has '0.weight' as float32[32, 8] where src has float32[16, 8]" in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(hostile.TENSOR_CASES))
def test_a_forged_tensor_header_is_refused_on_every_rank(dist_world: DistWorld, case: str) -> None:
    per_rank = _on_digest_path(dist_world, hostile.forged_tensor_header, 3, case)
    for ((kind, field, ranks, text), in_step), _, _ in per_rank:
        assert (kind, field, ranks) == ("BroadcastMismatchError", "header", (0,)), text
        assert "malformed header: rank 0 announced" in text
        assert in_step
    assert len({result[0][3] for result, _, _ in per_rank}) == 1


@pytest.mark.timeout(90)
def test_a_receivers_forged_row_is_a_mismatch_naming_it(dist_world: DistWorld) -> None:
    for ((kind, field, ranks, text), in_step), _, _ in _on_digest_path(dist_world, hostile.receiver_forges_its_row, 3):
        assert (kind, ranks) == ("BroadcastMismatchError", (2,)), text
        assert field in {"dtype", "shape"}
        assert in_step


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("case", "field"),
    [("negative-json-length", "header"), ("announces-128MiB", "size"), ("negative-tensor-count", "header")],
)
def test_a_forged_object_header_is_refused_before_allocating(dist_world: DistWorld, case: str, field: str) -> None:
    per_rank = _on_digest_path(dist_world, hostile.forged_object_header, 3, case)
    for ((kind, got_field, ranks, text), in_step, grew_mib), _, _ in per_rank[1:]:
        assert (kind, got_field) == ("BroadcastMismatchError", field), text
        assert ranks == ((0,) if field == "header" else (0, 1, 2)), text
        assert in_step
        assert grew_mib < 64, f"a receiver's peak memory grew by {grew_mib:.0f} MiB"


@pytest.mark.timeout(90)
def test_max_bytes_joins_the_digest_as_a_minimum(dist_world: DistWorld) -> None:
    per_rank = _on_digest_path(dist_world, hostile.object_over_the_cap, 2, 100_000)
    assert [result[:3] for result, _, _ in per_rank] == [("BroadcastMismatchError", "size", (0, 1))] * 2
    assert "accepts at most 100000 bytes" in per_rank[0][0][3]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["dtype-999", "wrong-count"])
def test_forged_state_dict_metadata_is_refused_on_every_rank(dist_world: DistWorld, case: str) -> None:
    per_rank = _on_digest_path(dist_world, hostile.forged_metadata, 3, case, False)
    for ((kind, field, ranks, text), in_step), _, _ in per_rank:
        assert (kind, field, ranks) == ("BroadcastMismatchError", "header", (0,)), text
        assert in_step


@pytest.mark.timeout(90)
def test_timeout_bounds_a_call_a_peer_never_makes(dist_world: DistWorld) -> None:
    per_rank = dist_world(tensors.timeout_when_a_rank_skips, world_size=2, timeout=30, env=DIGEST)
    kind, field, elapsed = per_rank[0]
    assert kind == "BroadcastTimeoutError"
    assert field in {"timeout", "peer"}
    assert elapsed < 10


def threshold_from_a_bad_variable() -> tuple[str, str, int]:
    import torch.distributed as dist

    from distinit.broadcast import _group, broadcast_tensor

    try:
        broadcast_tensor(torch.zeros(1) if dist.get_rank() == 0 else None)
    except ValueError as exc:
        return type(exc).__name__, str(exc), _group.resolve(None).seq
    return "no error", "", _group.resolve(None).seq


@pytest.mark.timeout(60)
def test_a_bad_threshold_variable_is_refused_on_every_rank_before_any_collective(dist_world: DistWorld) -> None:
    per_rank = dist_world(
        threshold_from_a_bad_variable, world_size=2, timeout=30, env={"DISTINIT_BROADCAST_DIGEST_FROM": "64 "}
    )
    for kind, text, seq in per_rank:
        assert kind == "ValueError"
        assert "DISTINIT_BROADCAST_DIGEST_FROM='64 '" in text
        assert seq == 0  # the call was not counted: nothing was exchanged


def events_of_a_mismatch() -> list[str]:
    import logging

    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor
    from distinit.errors import BroadcastMismatchError

    events: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(getattr(record, "distinit", {}).get("event", ""))

    logger, handler = logging.getLogger("distinit.broadcast"), Keep(logging.DEBUG)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        broadcast_tensor(torch.zeros(2) if dist.get_rank() == 0 else None)  # agrees: no digest_differs record
        with pytest.raises(BroadcastMismatchError):
            broadcast_tensor(torch.zeros(2) if dist.get_rank() == 0 else torch.zeros(3))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return [event for event in events if event != "broadcast.call"]


@pytest.mark.timeout(60)
def test_a_fallback_to_the_rows_is_logged_once_per_rank(dist_world: DistWorld) -> None:
    assert dist_world(events_of_a_mismatch, world_size=2, timeout=30, env=DIGEST) == [["broadcast.digest_differs"]] * 2
