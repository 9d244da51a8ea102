"""The hello a registered client sends, and its stack file, against a fake server thread that binds and listens on
a real Unix socket (``<wd>/sock``).

The identity line's parsing and the client that fails open (no server) are in
``tests/unit/watchdog/test_watchdog_hello.py``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from distinit.watchdog import WatchdogClient, _proc, _slots
from distinit.watchdog._protocol import HELLO, SOCKET_NAME, Identity, decode_identity, encode_reply


class FakeServer:
    """Accepts one client on ``<wd>/sock``, records what it sent, answers ``ok`` and keeps the connection."""

    def __init__(self, wd: Path) -> None:
        wd.mkdir(mode=0o700)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(wd / SOCKET_NAME))
        self.listener.listen(1)
        self.listener.settimeout(10)
        self.received = b""
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        self.conn = conn
        while self.received.count(b"\n") < 2:
            chunk = conn.recv(1024)
            if not chunk:
                break
            self.received += chunk
        conn.sendall(encode_reply(ok=True))

    def close(self) -> None:
        self.thread.join(10)
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[FakeServer]:
    server = FakeServer(tmp_path / "wd")
    yield server
    server.close()


def _stack_path(wd: Path) -> Path:
    return wd / _slots.stack_file_name(os.getpid(), _proc.start_time(os.getpid()) or 0)


def test_the_client_sends_its_ranks_with_the_hello(
    fake_server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=False)
    try:
        assert c.registered
        hello, identity = fake_server.received[: len(HELLO)], fake_server.received[len(HELLO) :]
        assert hello == HELLO  # what a server that predates the identity line reads, and all it reads
        assert decode_identity(identity) == Identity(rank=3, local_rank=1, world_size=4)
    finally:
        c.close()


def test_a_registered_client_has_a_stack_file_and_close_removes_it(fake_server: FakeServer, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    c = WatchdogClient(str(wd), dump_stacks=True)
    assert c.registered
    assert _stack_path(wd).is_file()
    c.close()
    assert sorted(p.name for p in wd.iterdir()) == [SOCKET_NAME]  # this process's files are removed


def test_a_fifo_planted_as_the_stack_file_cannot_hang_the_client(
    fake_server: FakeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkfifo(_stack_path(tmp_path / "wd"), 0o600)
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=True)  # used to block in open() until a reader came
    assert any(r.distinit["event"] == "watchdog.no_dump" for r in caplog.records)  # type: ignore[attr-defined]
    c.close()
