"""``via=`` and its route: argument checks, the pure route decision, slot layout, the segment primitives."""

from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path

import pytest
import torch

from distinit.broadcast._header import FLAG_ZERO_COPY
from distinit.broadcast._transport import choose as _via
from distinit.broadcast._transport import pack
from distinit.broadcast._transport import shm as _shm
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


def _written(data: list[int], size: int = 4096) -> _shm.Segment:
    seg = _shm.Segment.create(size, "distinit-bc-unit")
    seg.write(0, torch.tensor(data, dtype=torch.uint8))
    return seg


def test_segment_is_nameless_sealed_and_copy_on_write() -> None:
    before = set(os.listdir("/dev/shm"))
    seg = _written([1, 2, 3, 4])
    assert set(os.listdir("/dev/shm")) == before  # a memfd: nothing named anywhere
    assert stat.S_IMODE(os.fstat(seg.fd).st_mode) == 0o400
    seg.seal()
    with pytest.raises(PermissionError):  # sealed: not even the leader can change, shrink or grow it
        os.pwrite(seg.fd, b"x", 0)
    with pytest.raises(PermissionError):
        os.ftruncate(seg.fd, 0)
    status, reader = _shm.Segment.attach(seg.row(), 4096)
    assert status == _shm.OK and reader is not None
    view = reader.map_private()
    assert view[:4].tolist() == [1, 2, 3, 4]
    view[0] = 99  # private: the segment keeps 1
    assert os.pread(reader.fd, 1, 0) == b"\x01"
    with pytest.raises(OSError, match="Bad file descriptor"):  # read-only descriptor
        os.pwrite(reader.fd, b"x", 0)
    seg.close()
    reader.close()
    assert view[0] == 99 and view[1] == 2  # the mapping outlives both descriptors


def test_the_leader_compares_the_sealed_segment_with_what_it_wrote() -> None:
    """A write by another process before the seal (through /proc, as any process of the same user can) is found."""
    written = [(0, torch.tensor([1, 2, 3, 4], dtype=torch.uint8)), (64, torch.tensor([5, 6]).view(torch.uint8))]
    honest, attacked = (_shm.Segment.create(4096, "distinit-bc-unit") for _ in range(2))
    for seg in (honest, attacked):
        for offset, data in written:
            seg.write(offset, data)
    early = os.open(f"/proc/self/fd/{attacked.fd}", os.O_RDONLY)
    os.fchmod(early, 0o600)  # mode 0400 stops nobody of the same uid: the owner may change it back
    writer = os.open(f"/proc/self/fd/{attacked.fd}", os.O_RDWR)
    os.pwrite(writer, b"\x07", 65)
    for seg in (honest, attacked):
        seg.seal()
    assert honest.holds(written)
    assert not attacked.holds(written)
    with pytest.raises(PermissionError):  # the early descriptor cannot write any more
        os.pwrite(writer, b"\x07", 65)
    for fd in (early, writer, honest.fd, attacked.fd):
        os.close(fd)


def test_a_reader_refuses_another_file_an_unsealed_one_or_the_wrong_size() -> None:
    seg, other = _written([1]), _written([1])
    other.seal()
    forged = [*seg.row()[:3], *other.row()[3:]]  # this descriptor, another file's device and inode
    assert _shm.Segment.attach(forged, 4096) == (_shm.FOREIGN, None)
    assert _shm.Segment.attach(seg.row(), 4096) == (_shm.UNSEALED, None)
    seg.seal()
    assert _shm.Segment.attach(seg.row(), 8192) == (_shm.FOREIGN, None)
    gone = [_shm.OK, 2**22 + 1, 3, 0, 0]  # beyond pid_max: no such process
    assert _shm.Segment.attach(gone, 4096)[0] == _shm.ATTACH_FAILED + errno.ENOENT
    seg.close()
    other.close()


def test_a_writable_shared_mapping_makes_the_seal_fail() -> None:
    """An early writer that maps the segment shared and writable: the seal is refused (EBUSY), never skipped."""
    seg = _written([1])
    fd = os.open(f"/proc/self/fd/{seg.fd}", os.O_RDWR)
    shared = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(OSError, match="busy") as caught:
        seg.seal()
    assert caught.value.errno == errno.EBUSY
    shared.close()
    os.close(fd)
    seg.close()
