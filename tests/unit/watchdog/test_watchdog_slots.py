from __future__ import annotations

import os
from pathlib import Path

import pytest

from distinit.watchdog import _slots


def test_table_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "123.456.slots"
    mm = _slots.create_table(str(path), 123, 456)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert path.stat().st_size == _slots.FILE_SIZE
    q, d = memoryview(mm).cast("Q"), memoryview(mm).cast("d")
    base = _slots.HEADER_WORDS + 3 * _slots.SLOT_WORDS
    q[_slots.H_HWM] = 4
    q[base + _slots.S_SCOPE] = 0
    q[base + _slots.S_THREAD] = 77
    d[base + _slots.S_ARMED_AT] = 10.0
    d[base + _slots.S_DEADLINE] = 12.5
    reader = _slots.TableReader(str(path), os.geteuid())
    assert (reader.pid, reader.start, reader.closed) == (123, 456, False)
    assert reader.armed() == [(3, 12.5)]
    assert reader.slot_info(3) == (12.5, 10.0, _slots.OVERFLOW_SCOPE, 77)
    d[base + _slots.S_DEADLINE] = 0.0  # disarm: seen at once through the shared mapping
    assert reader.armed() == []
    assert reader.scope(999) == "?"
    reader.close()
    q.release()
    d.release()
    mm.close()


def test_the_table_records_the_workers_ranks_and_older_tables_read_as_unknown(tmp_path: Path) -> None:
    from distinit.watchdog._protocol import Identity

    known, old = tmp_path / "1.2.slots", tmp_path / "3.4.slots"
    _slots.create_table(str(known), 1, 2, Identity(rank=0, local_rank=0, world_size=2)).close()
    mm = _slots.create_table(str(old), 3, 4)
    q = memoryview(mm).cast("Q")
    q[_slots.H_RANK] = 2**40  # garbage in a reserved word is unknown, never a huge rank
    q.release()
    mm.close()
    readers = [_slots.TableReader(str(p), os.geteuid()) for p in (known, old)]
    assert [r.identity for r in readers] == [Identity(0, 0, 2), Identity()]
    for r in readers:
        r.close()


def test_reader_refuses_a_file_of_another_owner(tmp_path: Path) -> None:
    path = tmp_path / "1.2.slots"
    _slots.create_table(str(path), 1, 2).close()
    with pytest.raises(ValueError, match="not a 0600 slot table owned by uid"):
        _slots.TableReader(str(path), os.geteuid() + 1)


def test_reader_refuses_a_truncated_or_foreign_file(tmp_path: Path) -> None:
    short = tmp_path / "1.2.slots"
    short.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="size 100"):
        _slots.TableReader(str(short), os.geteuid())
    junk = tmp_path / "3.4.slots"
    junk.write_bytes(b"\0" * _slots.FILE_SIZE)
    junk.chmod(0o600)
    with pytest.raises(ValueError, match="bad slot-table header"):
        _slots.TableReader(str(junk), os.geteuid())


def test_reader_refuses_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.slots"
    _slots.create_table(str(real), 1, 2).close()
    link = tmp_path / "1.2.slots"
    link.symlink_to(real)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):  # O_NOFOLLOW: ELOOP
        _slots.TableReader(str(link), os.geteuid())


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        pytest.param("12.345.slots", (12, 345), id="ok"),
        pytest.param("12.345.stack", None, id="stack-file"),
        pytest.param("12.345.slots.tmp", None, id="temporary"),
        pytest.param("-1.345.slots", None, id="negative"),
        pytest.param("a.b.slots", None, id="letters"),
        pytest.param("sock", None, id="socket"),
        pytest.param("².1.slots", None, id="superscript-digit"),
        pytest.param("1.².slots", None, id="superscript-start"),
        pytest.param("١٢٣.4.slots", None, id="arabic-indic-digits"),
        pytest.param("１.2.slots", None, id="fullwidth-digit"),
        pytest.param("9" * 11 + ".1.slots", None, id="pid-too-long"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_file_name(name: str, parsed: tuple[int, int] | None) -> None:
    assert _slots.parse_file_name(name) == parsed


def test_scope_names_are_cut_on_a_character_boundary() -> None:
    raw = _slots.encode_scope("é" * 200)
    assert len(raw) <= _slots.SCOPE_BYTES - 1
    assert raw.decode("utf-8") == "é" * (len(raw) // 2)


def _armed_table(path: Path) -> None:
    mm = _slots.create_table(str(path), 1, 2)
    memoryview(mm).cast("Q")[_slots.H_HWM] = 1
    memoryview(mm).cast("d")[_slots.slot_base(0) + _slots.S_DEADLINE] = 5.0
    mm.close()


@pytest.mark.parametrize("size", [0, _slots.SLOTS_OFFSET - 8, _slots.SLOTS_OFFSET + 8])
def test_a_table_truncated_under_the_reader_raises_instead_of_sigbus(tmp_path: Path, size: int) -> None:
    path = tmp_path / "1.2.slots"
    _armed_table(path)
    reader = _slots.TableReader(str(path), os.geteuid())
    assert reader.armed() == [(0, 5.0)]
    os.truncate(path, size)  # a mapped reader would die here with SIGBUS on its next read
    with pytest.raises(_slots.TableDamaged, match="truncated"):
        reader.armed()
    reader.close()
    reader.close()  # idempotent


@pytest.mark.timeout(10)
def test_reader_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "1.2.slots"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ValueError, match="not a 0600 slot table"):
        _slots.TableReader(str(fifo), os.geteuid())  # a blocking open would wait for a writer for ever


def test_reader_refuses_a_table_others_may_write(tmp_path: Path) -> None:
    path = tmp_path / "1.2.slots"
    _armed_table(path)
    path.chmod(0o666)
    with pytest.raises(ValueError, match="mode 100666"):
        _slots.TableReader(str(path), os.geteuid())
