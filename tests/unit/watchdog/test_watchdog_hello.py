"""The hello and its identity line (read by the server through a socket pair), and a client that fails open.

A registered client's hello and stack file, against a fake server listening on a Unix socket, are in
``tests/integration/watchdog/test_watchdog_hello_socket.py``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from pathlib import Path

import pytest

from distinit.watchdog import WatchdogClient
from distinit.watchdog._handshake import _identity_after_hello
from distinit.watchdog._protocol import (
    HELLO,
    MAX_IDENTITY_BYTES,
    Identity,
    decode_identity,
    encode_identity,
)


def test_a_client_that_fails_open_creates_no_stack_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A fail-open worker killed later (SIGKILL, os._exit) cannot clean up, and no server ever will.
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=True)
    try:
        assert not c.registered
        assert list((tmp_path / "wd").glob("*.stack")) == []
    finally:
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
