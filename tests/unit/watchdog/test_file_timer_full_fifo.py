"""The drop-in client's wait for room in a full FIFO: give up only when the server reads nothing.

A real pipe, filled to the brim, so every write really fails with EAGAIN; ``select.poll`` is replaced so the test
says when room "appears" without a second writer racing for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from distinit.watchdog import _timer_client

F_SETPIPE_SZ = 1031


@pytest.fixture
def full_pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    with contextlib.suppress(BlockingIOError):
        for _ in range(64):  # 4096 bytes hold 8 of them: the pipe is full long before the loop ends
            os.write(write_end, b"x" * 512)
    with pytest.raises(BlockingIOError):
        os.write(write_end, b"x")
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


class Poller:
    """poll(): "room" while ``room_until`` has not passed (another writer takes it), then drains or says nothing."""

    def __init__(self, read_end: int, room_until: float, drain: bool) -> None:
        self.read_end, self.room_until, self.drain, self.calls = read_end, room_until, drain, 0

    def register(self, fd: int, events: int) -> None:
        pass

    def poll(self, timeout_ms: int) -> list[tuple[int, int]]:
        self.calls += 1
        if time.monotonic() < self.room_until:
            time.sleep(0.002)
            return [(0, 4)]  # room was there; the write below still finds the pipe full, as after a lost race
        if self.drain:
            os.read(self.read_end, 4096)
            return [(0, 4)]
        time.sleep(timeout_ms / 1000)
        return []


def patch(monkeypatch: pytest.MonkeyPatch, poller: Poller) -> None:
    monkeypatch.setattr(_timer_client, "select", SimpleNamespace(poll=lambda: poller, POLLOUT=4))
    monkeypatch.setattr(_timer_client, "_FULL_WAIT", 0.05)


def test_a_write_that_keeps_losing_the_room_waits_while_the_server_reads(
    monkeypatch: pytest.MonkeyPatch, full_pipe: tuple[int, int]
) -> None:
    read_end, write_end = full_pipe
    started = time.monotonic()
    poller = Poller(read_end, room_until=started + 0.3, drain=True)  # six times _FULL_WAIT of lost races
    patch(monkeypatch, poller)
    assert _timer_client.FileTimerClient._write_when_room(write_end, b"line\n") is True
    assert time.monotonic() - started >= 0.3 and poller.calls > 2


def test_a_fifo_in_which_no_room_appears_is_given_up_after_the_full_wait(
    monkeypatch: pytest.MonkeyPatch, full_pipe: tuple[int, int]
) -> None:
    read_end, write_end = full_pipe
    started = time.monotonic()
    patch(monkeypatch, Poller(read_end, room_until=started + 0.1, drain=False))
    assert _timer_client.FileTimerClient._write_when_room(write_end, b"line\n") is False
    assert 0.15 <= time.monotonic() - started < 5  # the room stopped at 0.1 s; then one _FULL_WAIT of nothing


def test_the_whole_wait_is_bounded_though_room_keeps_appearing(
    monkeypatch: pytest.MonkeyPatch, full_pipe: tuple[int, int]
) -> None:
    read_end, write_end = full_pipe
    monkeypatch.setattr(_timer_client, "_CONTENDED_WAIT", 0.2)
    started = time.monotonic()
    patch(monkeypatch, Poller(read_end, room_until=started + 60, drain=False))
    assert _timer_client.FileTimerClient._write_when_room(write_end, b"line\n") is False
    assert 0.2 <= time.monotonic() - started < 5
