"""``_transport/shm.py``'s segment primitives: nameless, sealed, copy-on-write, checked by the leader and readers."""

from __future__ import annotations

import errno
import mmap
import os
import stat

import pytest
import torch

from distinit.broadcast._transport import shm as _shm


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
