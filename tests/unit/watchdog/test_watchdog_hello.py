"""The hello and its identity line, and the stack file of a registered client (a fake server thread)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from distinit.watchdog import WatchdogClient, _proc, _slots
from distinit.watchdog._handshake import _identity_after_hello
from distinit.watchdog._protocol import (
    HELLO,
    MAX_IDENTITY_BYTES,
    SOCKET_NAME,
    Identity,
    decode_identity,
    encode_identity,
    encode_reply,
)


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


def test_a_client_that_fails_open_creates_no_stack_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A fail-open worker killed later (SIGKILL, os._exit) cannot clean up, and no server ever will.
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=True)
    try:
        assert not c.registered
        assert list((tmp_path / "wd").glob("*.stack")) == []
    finally:
        c.close()


def test_a_fifo_planted_as_the_stack_file_cannot_hang_the_client(
    fake_server: FakeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkfifo(_stack_path(tmp_path / "wd"), 0o600)
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=True)  # used to block in open() until a reader came
    assert any(r.distinit["event"] == "watchdog.no_dump" for r in caplog.records)  # type: ignore[attr-defined]
    c.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, Identity(2, 0, 8), id="torchrun"),
        pytest.param({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "6"}, Identity(5, 1, 6), id="slurm"),
        pytest.param({"RANK": "1", "SLURM_PROCID": "7"}, Identity(1, None, None), id="rank-wins-over-slurm"),
        pytest.param({"RANK": "-1", "LOCAL_RANK": "x", "WORLD_SIZE": "²"}, Identity(), id="malformed"),
        pytest.param({"RANK": " 4 ", "WORLD_SIZE": ""}, Identity(4, None, None), id="blank-and-spaces"),
        pytest.param({}, Identity(), id="unset"),
    ],
)
def test_identity_from_the_environment(env: dict[str, str], expected: Identity) -> None:
    assert Identity.from_env(env) == expected


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b'{"rank": 1}',  # no newline: incomplete
        b"[1, 2]\n",
        b"not json\n",
        b'{"rank": true, "local_rank": -3, "world_size": 1e3}\n',
        b'{"rank": "1"}\n',
        b'{"rank": ' + b" " * MAX_IDENTITY_BYTES + b"1}\n",
    ],
)
def test_a_malformed_identity_is_unknown_never_an_error(raw: bytes) -> None:
    assert decode_identity(raw) == Identity()


def test_identity_round_trip_and_label() -> None:
    ident = Identity(rank=0, local_rank=0, world_size=1)
    assert decode_identity(encode_identity(ident)) == ident
    assert decode_identity(encode_identity(Identity())) == Identity()
    assert ident.label() == "RANK 0"
    assert Identity().label() == "rank unknown"


def test_the_server_reads_the_identity_without_waiting_and_old_clients_send_none() -> None:
    for sent, expected in [
        (HELLO + encode_identity(Identity(1, 1, 2)), Identity(1, 1, 2)),
        (HELLO, Identity()),  # a client that predates the identity line: nothing more comes
    ]:
        server_end, client_end = socket.socketpair()
        with contextlib.closing(server_end), contextlib.closing(client_end):
            server_end.setblocking(False)
            client_end.sendall(sent)
            assert server_end.recv(len(HELLO)) == HELLO
            assert _identity_after_hello(server_end) == expected
