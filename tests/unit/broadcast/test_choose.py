"""``_transport/choose.py``: ``via=``'s argument checks, the route settled from the header, the pure route decision."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distinit.broadcast._header import FLAG_ZERO_COPY
from distinit.broadcast._transport import choose as _via
from distinit.broadcast._transport import pack
from distinit.broadcast._transport.choose import AUTO_SHM_MIN_BYTES, decide, group_hosts, settled, via_option
from distinit.broadcast._transport.pack import slots

A, B = (11, 12), (21, 22)


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        pytest.param({"via": "tcp"}, ValueError, "via", id="unknown-via"),
        pytest.param({"via": None}, ValueError, "via", id="via-None"),
        pytest.param({"via": "file"}, ValueError, "path", id="file-without-path"),
        pytest.param({"via": "shm", "path": "/tmp"}, ValueError, "path", id="path-without-file"),
        pytest.param({"via": "network", "zero_copy": True}, ValueError, "zero_copy", id="zero-copy-on-network"),
        pytest.param({"via": "file", "path": "/tmp", "zero_copy": True}, ValueError, "zero_copy", id="zero-copy-file"),
        pytest.param({"via": "shm", "keep": True}, ValueError, "keep", id="keep-without-file"),
        pytest.param({"via": "shm", "zero_copy": 1}, TypeError, "zero_copy", id="zero-copy-int"),
        pytest.param({"via": "file", "path": 3}, TypeError, "path", id="path-int"),
    ],
)
def test_bad_options_are_refused_naming_the_argument(
    kwargs: dict[str, object], error: type[Exception], named: str
) -> None:
    via = kwargs.pop("via")
    with pytest.raises(error, match=named):
        via_option(via, **kwargs)


def test_good_options_and_their_flags() -> None:
    assert via_option("network").flags == 0
    assert via_option("shm", zero_copy=True).flags == 2 << 8 | FLAG_ZERO_COPY
    assert via_option("auto").flags == 1 << 8
    opt = via_option("file", path=Path("/tmp"), keep=True)
    assert (opt.path, opt.keep, opt.flags) == ("/tmp", True, 3 << 8)


def _rows(keys: list[tuple[int, int]], free: int = 1 << 40) -> list[list[int]]:
    return [[*key, free, 7, 9] for key in keys]


@pytest.mark.parametrize(
    ("via", "keys", "src", "total", "free", "kind", "note"),
    [
        pytest.param("shm", [A, A, A], 0, 1 << 20, 1 << 40, "shm", "", id="one-host"),
        pytest.param("shm", [A, B, A, B], 1, 1 << 20, 1 << 40, "shm", "", id="two-hosts"),
        pytest.param("shm", [A, B], 0, 1 << 20, 1 << 40, "network", "share a host", id="not-co-located"),
        pytest.param("shm", [A, A], 0, 1 << 20, 1000, "network", "bytes free", id="dev-shm-too-small"),
        pytest.param("shm", [A, A], 0, 0, 1 << 40, "network", "nothing", id="empty"),
        pytest.param("auto", [A] * 4, 0, AUTO_SHM_MIN_BYTES - 1, 1 << 40, "network", "auto", id="auto-small"),
        pytest.param("auto", [A] * 4, 0, AUTO_SHM_MIN_BYTES, 1 << 40, "shm", "", id="auto-large"),
        pytest.param("auto", [A] * 3, 0, AUTO_SHM_MIN_BYTES, 1 << 40, "network", "auto", id="auto-3-per-host"),
        pytest.param("file", [A, B], 0, 1 << 20, 0, "file", "", id="file"),
    ],
)
def test_route_decision(
    via: str, keys: list[tuple[int, int]], src: int, total: int, free: int, kind: str, note: str
) -> None:
    route = decide(via, _rows(keys, free), src=src, total=total, zero_copy=True)
    assert route.kind == kind and note in route.note
    assert route.token == f"{7:016x}{9:016x}"


def test_auto_keeps_copying_receivers_on_the_network() -> None:
    route = decide("auto", _rows([A] * 4), src=0, total=AUTO_SHM_MIN_BYTES, zero_copy=False)
    assert route.kind == "network" and "zero_copy" in route.note


@pytest.mark.parametrize(
    ("via", "zero_copy", "total", "kind"),
    [
        pytest.param("auto", False, AUTO_SHM_MIN_BYTES, "network", id="auto-no-rank-asked-zero-copy"),
        pytest.param("auto", True, AUTO_SHM_MIN_BYTES - 1, "network", id="auto-small"),
        pytest.param("auto", False, 0, "network", id="auto-empty"),
        pytest.param("auto", True, AUTO_SHM_MIN_BYTES, None, id="auto-needs-the-hosts"),
        pytest.param("shm", False, 1 << 20, None, id="shm-always-agrees"),
        pytest.param("file", False, 1 << 20, None, id="file-always-agrees"),
    ],
)
def test_the_header_alone_settles_auto_when_no_rank_asked_for_zero_copy(
    via: str, zero_copy: bool, total: int, kind: str | None
) -> None:
    """Settled from header facts only (the same on every rank), so no agreement collective runs."""
    route = settled(via, zero_copy=zero_copy, total=total, size=3)
    assert (route.kind if route is not None else None) == kind
    if route is not None and total:
        assert "zero_copy" in route.note


@pytest.mark.parametrize("via", ["auto", "shm"])
def test_a_world_of_one_shares_memory_with_no_one(via: str) -> None:
    route = settled(via, zero_copy=True, total=AUTO_SHM_MIN_BYTES, size=1)
    assert route is not None and route.kind == "network" and "share a host" in route.note
    assert route.note == decide(via, _rows([A]), src=0, total=AUTO_SHM_MIN_BYTES, zero_copy=True).note
    assert settled("file", zero_copy=False, total=1, size=1) is None  # a file is written even for one rank


def test_hosts_put_src_first_and_lead_its_host() -> None:
    assert group_hosts([A, B, A, B], src=3) == ((3, 1), (0, 2))
    assert group_hosts([A, A, B], src=0) == ((0, 1), (2,))


def test_slots_are_aligned_and_cover_every_byte() -> None:
    spec = [(torch.float32, (3,)), (torch.bool, ()), (torch.float64, (0, 4)), (torch.int16, (65,))]
    offsets, total = slots(spec)
    assert offsets == [0, 64, 128, 128] and total == 128 + 192
    assert all(o % pack.ALIGN == 0 for o in offsets)


def test_host_key_is_stable_within_a_process() -> None:
    assert _via.host_key() == _via.host_key()
