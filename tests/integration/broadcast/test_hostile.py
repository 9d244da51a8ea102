"""A hostile or buggy peer forges its header row, metadata or payload (issue 12, items 11-15), on real gloo groups.

Each case rewrites what one rank puts on the wire (its header words, inline bytes, metadata or JSON)
and checks that every honest rank raises the documented error, naming the rank at fault, instead of
being killed by SIGABRT inside gloo, allocating what the forger announced, or leaking a RuntimeError,
KeyError, JSONDecodeError or RecursionError. After a verdict the group must still be in step.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

import pytest
import torch

from distinit.testing import DistWorld

MIB = 1 << 20


def _forge_row(words: dict[int, int], inline: bytes | None = None) -> Callable[[], None]:
    """Make this rank's next header rows carry ``words`` (and ``inline`` bytes); returns the undo.

    Forges both ways a row travels: the row exchange and, in large groups, the digest all_reduce.
    """
    from distinit.broadcast import _digest, _header

    def forging(real: Callable[..., Any]) -> Callable[..., Any]:
        def forged(row: list[int], **kw: Any) -> Any:
            row = list(row)
            for index, value in words.items():
                row[index] = value
            if inline is not None:
                kw["inline"] = inline
            return real(row, **kw)

        return forged

    real_exchange, real_agree = _header.exchange, _digest.agree
    _header.exchange = forging(real_exchange)  # type: ignore[assignment]
    _digest.agree = forging(real_agree)  # type: ignore[assignment]

    def undo() -> None:
        _header.exchange, _digest.agree = real_exchange, real_agree  # type: ignore[assignment]

    return undo


def _in_step() -> bool:
    """A correct call after the case: every rank is at the same point of the protocol."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor

    got = broadcast_tensor(torch.arange(3.0) if dist.get_rank() == 0 else None, timeout=20)
    return bool(torch.equal(got, torch.arange(3.0)))


def _outcome(call: Callable[[], Any]) -> tuple[str, str, tuple[int, ...], str]:
    """(error class, field, ranks at fault, message) of ``call``; any exception type is reported, not raised."""
    from distinit.errors import BroadcastError

    try:
        call()
    except BroadcastError as exc:
        return type(exc).__name__, exc.field, exc.ranks, str(exc)
    except Exception as exc:
        return type(exc).__name__, "", (), str(exc)[:300]
    return "no error", "", (), ""


# --------------------------------------------------------------------------------------------- tensor headers

_W = {"ndim": 8, "shape": 9, "nbytes": 21, "dtype": 6, "inline": 25, "aux": 24, "count": 23}

TENSOR_CASES: dict[str, tuple[torch.Tensor, dict[int, int], bytes | None]] = {
    # item 11: float32[2] announced, 1 MiB behind it: receivers allocated 8 bytes and gloo aborted them.
    "float32[2]-with-1MiB": (torch.zeros(MIB // 4), {_W["ndim"]: 1, _W["shape"]: 2}, None),
    # item 12: shapes, dtype codes and lengths no tensor can have.
    "shape-[2^31]^3": (torch.zeros(4), {_W["ndim"]: 3, 9: 1 << 31, 10: 1 << 31, 11: 1 << 31}, None),
    "shape-[-5]": (torch.zeros(4), {_W["ndim"]: 1, _W["shape"]: -5, _W["nbytes"]: -20}, None),
    "dtype-999-with-2^62-bytes": (torch.zeros(4), {_W["dtype"]: 999, _W["nbytes"]: 1 << 62}, None),
    "shape-[2^40-1]^2": (torch.zeros(4), {_W["ndim"]: 2, 9: (1 << 40) - 1, 10: (1 << 40) - 1}, None),
    "ndim-900": (torch.zeros(4), {_W["ndim"]: 900}, None),
    "negative-nbytes": (torch.zeros(4), {_W["nbytes"]: -16}, None),
    # item 15: one inline byte for float32[4] filled the receiver's tensor with that byte.
    "one-inline-byte-for-float32[4]": (torch.zeros(4), {_W["inline"]: 1}, b"\x07"),
}


def forged_tensor_header(case: str) -> tuple[tuple[str, str, tuple[int, ...], str], bool]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor

    tensor, words, inline = TENSOR_CASES[case]
    undo = _forge_row(words, inline) if dist.get_rank() == 0 else (lambda: None)
    try:
        seen = _outcome(lambda: broadcast_tensor(tensor.clone() if dist.get_rank() == 0 else None, timeout=20))
    finally:
        undo()
    return seen, _in_step()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_a_forged_tensor_header_is_refused_on_every_rank(dist_world: DistWorld, case: str) -> None:
    per_rank = dist_world(forged_tensor_header, world_size=3, timeout=60, args=(case,))
    for (kind, field, ranks, text), in_step in per_rank:
        assert (kind, field, ranks) == ("BroadcastMismatchError", "header", (0,)), text
        assert "malformed header: rank 0 announced" in text
        assert in_step
    assert len({seen[3] for seen, _ in per_rank}) == 1  # the same message everywhere


def receiver_forges_its_row() -> tuple[tuple[str, str, tuple[int, ...], str], bool]:
    """A receiver's own row drives nothing: garbage in it is compared, never allocated from."""
    import torch.distributed as dist

    from distinit.broadcast import broadcast_tensor

    rank = dist.get_rank()
    forged = {_W["ndim"]: 900, _W["nbytes"]: 1 << 62, _W["dtype"]: 999}
    undo = _forge_row(forged) if rank == 2 else (lambda: None)
    try:
        seen = _outcome(lambda: broadcast_tensor(torch.zeros(4) if rank != 1 else None, timeout=20))
    finally:
        undo()
    return seen, _in_step()


@pytest.mark.timeout(60)
def test_a_receivers_forged_row_is_a_mismatch_naming_it(dist_world: DistWorld) -> None:
    per_rank = dist_world(receiver_forges_its_row, world_size=3, timeout=45)
    for (kind, field, ranks, text), in_step in per_rank:
        assert (kind, ranks) == ("BroadcastMismatchError", (2,)), text
        assert field in {"dtype", "shape"}
        assert in_step


# --------------------------------------------------------------------------------------------- objects


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def forged_object_header(case: str) -> tuple[tuple[str, str, tuple[int, ...], str], bool, float]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object

    rank = dist.get_rank()
    value = list(range(2000))  # ~9 KB of JSON: sent after the header
    words = {
        "negative-json-length": {_W["aux"]: -10, _W["nbytes"]: 10},
        "announces-128MiB": {_W["aux"]: 128 * MIB},
        "negative-tensor-count": {_W["count"]: -1},
    }[case]
    undo = _forge_row(words) if rank == 0 else (lambda: None)
    before = _peak_mib()
    try:
        seen = _outcome(lambda: broadcast_object(value if rank == 0 else None, type=list[int], timeout=20))
    finally:
        undo()
    return seen, _in_step(), _peak_mib() - before


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("case", "field"),
    [("negative-json-length", "header"), ("announces-128MiB", "size"), ("negative-tensor-count", "header")],
)
def test_a_forged_object_header_is_refused_before_allocating(dist_world: DistWorld, case: str, field: str) -> None:
    per_rank = dist_world(forged_object_header, world_size=3, timeout=45, args=(case,))
    for (kind, got_field, ranks, text), in_step, grew_mib in per_rank[1:]:
        assert (kind, got_field) == ("BroadcastMismatchError", field), text
        assert ranks == ((0,) if field == "header" else (0, 1, 2)), text  # "size": every rank whose cap is short
        assert in_step
        assert grew_mib < 64, f"a receiver's peak memory grew by {grew_mib:.0f} MiB"


def object_over_the_cap(max_bytes: int | None) -> tuple[str, str, tuple[int, ...], str]:
    import torch.distributed as dist

    from distinit.broadcast import broadcast_object

    value = "x" * 300_000  # ~300 KB of JSON
    return _outcome(lambda: broadcast_object(value if dist.get_rank() == 0 else None, type=str, max_bytes=max_bytes))


@pytest.mark.timeout(60)
def test_the_size_cap_is_a_keyword_and_an_environment_variable(dist_world: DistWorld) -> None:
    per_rank = dist_world(object_over_the_cap, world_size=2, timeout=30, args=(100_000,))
    assert [seen[:3] for seen in per_rank] == [("BroadcastMismatchError", "size", (0, 1))] * 2
    assert "accepts at most 100000 bytes" in per_rank[0][3]
    per_rank = dist_world(
        object_over_the_cap, world_size=2, timeout=30, args=(None,), env={"DISTINIT_BROADCAST_MAX_BYTES": "1000"}
    )
    assert [seen[:2] for seen in per_rank] == [("BroadcastMismatchError", "size")] * 2
    assert dist_world(object_over_the_cap, world_size=2, timeout=30, args=(None,)) == [("no error", "", (), "")] * 2


def deep_marker_payload() -> tuple[str, str, tuple[int, ...], str]:
    """Item 12: a tensor marker nested 900 deep made the receivers' marker walk raise RecursionError."""
    import pydantic
    import torch.distributed as dist

    from distinit.broadcast import _object, broadcast_object

    class Holder(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        weight: Any

    marker = b'{"__distinit_tensor__": 0, "dtype": 1, "shape": [2]}'
    payload = b'{"weight": ' + b"[" * 900 + marker + b"]" * 900 + b"}"
    if dist.get_rank() == 0:
        _object.encode = lambda obj, tp: (payload, [torch.zeros(2)])  # type: ignore[assignment]
    return _outcome(lambda: broadcast_object(Holder(weight=1) if dist.get_rank() == 0 else None, type=Holder))


@pytest.mark.timeout(60)
def test_a_deeply_nested_marker_is_a_payload_error_naming_src(dist_world: DistWorld) -> None:
    src, *receivers = dist_world(deep_marker_payload, world_size=3, timeout=45)
    assert src[0] == "no error"  # src sent happily
    for kind, field, ranks, text in receivers:
        assert (kind, field, ranks) == ("BroadcastMismatchError", "payload", (0,)), text
        assert "nests" in text


# --------------------------------------------------------------------------------------------- state dicts

META_CASES = {
    "dtype-999": b'[["a", 999, [2]]]',
    "bad-json": b'[["a", 1, [2]',
    "shape-[2^40-1]^2": b'[["a", 1, [1099511627775, 1099511627775]]]',
    "negative-dim": b'[["a", 1, [-3]]]',
    "deeply-nested": b"[" * 100_000 + b"]" * 100_000,
    "wrong-count": b'[["a", 1, [2]], ["b", 1, [2]]]',
}


def forged_metadata(case: str, padded: bool) -> tuple[tuple[str, str, tuple[int, ...], str], bool]:
    """Src sends forged metadata; rank 1 allocates from it, rank 2 passed its own state dict (both must agree)."""
    import torch.distributed as dist

    from distinit.broadcast import _state_dict, broadcast_state_dict

    rank = dist.get_rank()
    forged = META_CASES[case] + (b" " * 8000 if padded else b"")  # > 4 KiB: sent in a broadcast of its own
    real = _state_dict.encode_meta
    if rank == 0:
        _state_dict.encode_meta = lambda meta: forged  # type: ignore[assignment]
    sd = {"a": torch.ones(2)} if rank != 1 else None
    try:
        seen = _outcome(lambda: broadcast_state_dict(sd, timeout=20))
    finally:
        _state_dict.encode_meta = real  # type: ignore[assignment]
    return seen, _in_step()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("padded", [False, True], ids=["inline", "out-of-band"])
@pytest.mark.parametrize("case", list(META_CASES))
def test_forged_state_dict_metadata_is_refused_on_every_rank(dist_world: DistWorld, case: str, padded: bool) -> None:
    per_rank = dist_world(forged_metadata, world_size=3, timeout=45, args=(case, padded))
    for (kind, field, ranks, text), in_step in per_rank:
        assert (kind, field, ranks) == ("BroadcastMismatchError", "header", (0,)), text
        assert in_step
    assert len({seen[3] for seen, _ in per_rank}) == 1


def receiver_announces_huge_metadata() -> tuple[tuple[str, str, tuple[int, ...], str], float]:
    """Item 14: a receiver whose keys differ announces 128 MiB of metadata for the comparison."""
    import torch.distributed as dist

    from distinit.broadcast import _state_dict, broadcast_state_dict

    rank = dist.get_rank()
    if rank == 2:
        _state_dict.encode_meta = lambda meta: b" " * (128 * MIB)  # type: ignore[assignment]
    sd = {"a": torch.ones(2)} if rank != 2 else {"b": torch.ones(2)}
    before = _peak_mib()
    seen = _outcome(lambda: broadcast_state_dict(sd, timeout=20))
    return seen, _peak_mib() - before


@pytest.mark.timeout(60)
def test_only_src_sizes_drive_allocations(dist_world: DistWorld) -> None:
    per_rank = dist_world(receiver_announces_huge_metadata, world_size=3, timeout=45)
    for (kind, field, ranks, text), grew_mib in per_rank[:2]:  # the honest ranks
        assert (kind, field, ranks) == ("BroadcastMismatchError", "keys", (2,)), text
        assert f"rank 2 announced {128 * MIB} bytes of metadata" in text
        assert grew_mib < 64, f"an honest rank's peak memory grew by {grew_mib:.0f} MiB"
