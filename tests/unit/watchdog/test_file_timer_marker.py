"""Which reader the drop-in client keeps its FIFO open for: distinit's marked server only, never on a doubt."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from distinit.watchdog._proc import start_time
from distinit.watchdog._timer_client import (
    _remove_own,
    marker_path,
    publish_marker,
    served_by_distinit,
    stack_path,
    withdraw_marker,
)
from distinit.watchdog.elastic import FileTimerClient

pytestmark = pytest.mark.timeout(60)


class Fifo:
    """A FIFO with a read end (no write end of its own: a reader sees end-of-file once every client closed)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        os.mkfifo(self.path, 0o600)
        self.rfd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.marker = -1

    def publish(self) -> None:
        self.marker = publish_marker(self.path, os.fstat(self.rfd))

    def writer_left_open(self) -> bool:
        """Drain what was written; whether a writer still holds the FIFO open (torch's reader would block)."""
        while True:
            try:
                if not os.read(self.rfd, 65536):
                    return False  # end of file: every writer closed it
            except BlockingIOError:
                return True

    def close(self) -> None:
        if self.marker >= 0:
            withdraw_marker(self.path, self.marker)
        os.close(self.rfd)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Fifo]:
    f = Fifo(tmp_path / "timer.fifo")
    yield f
    f.close()


def _write_marker(fifo: Fifo, **doc: object) -> None:
    Path(marker_path(fifo.path)).write_text(json.dumps(doc))


def _stale(fifo: Fifo) -> None:  # a server that died: its marker is left, nobody holds its lock
    os.close(publish_marker(fifo.path, os.fstat(fifo.rfd)))


def _another_fifos(fifo: Fifo) -> None:  # torch's server replaced the FIFO, distinit's still runs
    other = fifo.path + ".old"
    os.mkfifo(other)
    fifo.marker = publish_marker(fifo.path, os.stat(other))


def _symlink(fifo: Fifo) -> None:
    real = fifo.path + ".real"
    fifo.marker = publish_marker(fifo.path, os.fstat(fifo.rfd))
    os.rename(marker_path(fifo.path), real)
    os.symlink(real, marker_path(fifo.path))


def _other_format(fifo: Fifo) -> None:
    st = os.fstat(fifo.rfd)
    _write_marker(fifo, server="someone-else", version=1, dev=st.st_dev, ino=st.st_ino)


def _garbage(fifo: Fifo) -> None:
    Path(marker_path(fifo.path)).write_bytes(b"[" * 4000)


def _too_big(fifo: Fifo) -> None:
    Path(marker_path(fifo.path)).write_bytes(b" " * 5000)


def _a_fifo(fifo: Fifo) -> None:  # opened without blocking, and refused: not a regular file
    os.mkfifo(marker_path(fifo.path))


def _a_directory(fifo: Fifo) -> None:
    os.mkdir(marker_path(fifo.path))


def _another_users(fifo: Fifo) -> None:
    fifo.marker = publish_marker(fifo.path, os.fstat(fifo.rfd))
    os.chown(marker_path(fifo.path), 54321, 54321)


NOT_DISTINIT = [
    pytest.param(lambda fifo: None, id="no-marker"),
    pytest.param(_stale, id="stale-marker-of-a-dead-server"),
    pytest.param(_another_fifos, id="marker-names-another-fifo"),
    pytest.param(_symlink, id="symlink"),
    pytest.param(_other_format, id="other-format"),
    pytest.param(_garbage, id="garbage"),
    pytest.param(_too_big, id="too-big"),
    pytest.param(_a_fifo, id="a-fifo-planted"),
    pytest.param(_a_directory, id="a-directory"),
    pytest.param(
        _another_users,
        id="another-users",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root"),
    ),
]


def test_a_live_marker_naming_the_fifo_reads_as_distinits_server(fifo: Fifo) -> None:
    fifo.publish()
    wfd = os.open(fifo.path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        assert served_by_distinit(fifo.path, wfd)
        withdraw_marker(fifo.path, fifo.marker)
        fifo.marker = -1
        assert not os.path.exists(marker_path(fifo.path))
        assert not served_by_distinit(fifo.path, wfd)
    finally:
        os.close(wfd)


@pytest.mark.parametrize("plant", NOT_DISTINIT)
def test_anything_doubtful_reads_as_torchs_server(fifo: Fifo, plant: object) -> None:
    assert callable(plant)
    plant(fifo)
    wfd = os.open(fifo.path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        started = time.monotonic()
        assert not served_by_distinit(fifo.path, wfd)
        assert time.monotonic() - started < 5  # a planted FIFO or lock never blocks it
    finally:
        os.close(wfd)


def test_with_torchs_server_each_request_closes_the_fifo_and_makes_no_stack_file(fifo: Fifo) -> None:
    client = FileTimerClient(fifo.path)
    client.acquire("step", time.time() + 60)
    assert not fifo.writer_left_open()  # torch's blocking readline() returns: its loop reaps on time
    client.release("step")
    assert not fifo.writer_left_open()
    assert client._fd is None
    assert not os.path.exists(stack_path(fifo.path, os.getpid(), start_time(os.getpid()) or 0))
    client.close()


def test_with_distinits_server_the_fifo_stays_open_and_close_removes_the_stack_file(fifo: Fifo) -> None:
    fifo.publish()
    client = FileTimerClient(fifo.path)
    client.acquire("step", time.time() + 60)
    client.release("step")
    assert fifo.writer_left_open()
    dump_file = stack_path(fifo.path, os.getpid(), start_time(os.getpid()) or 0)
    assert os.path.exists(dump_file)
    client.close()
    assert not os.path.exists(dump_file)
    assert not fifo.writer_left_open()


def test_a_server_replaced_by_torchs_is_told_apart_on_the_reopen(tmp_path: Path) -> None:
    first = Fifo(tmp_path / "timer.fifo")
    first.publish()
    client = FileTimerClient(first.path)
    client.acquire("step", time.time() + 60)
    dump_file = stack_path(first.path, os.getpid(), start_time(os.getpid()) or 0)
    assert os.path.exists(dump_file)
    # distinit's server stops (marker withdrawn, FIFO closed and removed); torch's makes a new FIFO there.
    first.close()
    os.unlink(first.path)
    successor = Fifo(tmp_path / "timer.fifo")
    try:
        client.release("step")  # EPIPE on the old FIFO, then one reopen: torch's reader this time
        assert not successor.writer_left_open()
        assert client._fd is None
        assert not os.path.exists(dump_file)  # torch's server would never ask for it, nor remove it
    finally:
        client.close()
        successor.close()


def test_the_exit_cleanup_of_a_stack_file_is_its_own_process_only(tmp_path: Path) -> None:
    # A fork child runs its parent's atexit list: it must not remove the parent's file, still in use.
    path = tmp_path / "x.stack"
    path.write_bytes(b"")
    _remove_own(str(path), os.getpid() + 1)
    assert path.exists()
    _remove_own(str(path), os.getpid())
    assert not path.exists()
