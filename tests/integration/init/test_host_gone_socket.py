"""What real probes of real listeners say about the store host (issue 34): a listener that drops the probe (reset,
EOF, or closed with the probe in its backlog) is absent, one that never answers is unclear, a real TCPStore serves.

Binds and listens on loopback ports and starts a real TCPStore. The flake behind these tests, the pure judgement
and the probing loop are in ``tests/unit/init/test_host_gone.py``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from distinit._net import probe
from distinit.init._policy import StoreSign, store_sign


@contextlib.contextmanager
def _serve(accept: Callable[[socket.socket], None]) -> Iterator[int]:
    """A listener on a free port whose one connection ``accept`` handles in a thread."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        thread = threading.Thread(target=accept, args=(listener,), daemon=True)
        thread.start()
        yield listener.getsockname()[1]
        thread.join(5)


def _reset(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends a reset
    conn.close()


def _eof(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.recv(64)
    conn.close()


def _sign_of(port: int, handshake_timeout: float = 2.0) -> StoreSign:
    seen = probe("127.0.0.1", port, 5.0, handshake_timeout=handshake_timeout)
    return store_sign(seen.kind, seen.detail)


@pytest.mark.parametrize("accept", [_reset, _eof], ids=["reset", "eof"])
def test_a_listener_that_drops_the_probe_is_absent(accept: Callable[[socket.socket], None]) -> None:
    with _serve(accept) as port:
        assert _sign_of(port) == "absent"


def test_a_listener_that_closes_with_the_probe_in_its_backlog_is_absent() -> None:
    """The dying store host: the kernel took the connection, then the listener closed (reset, or refused if the
    probe came after)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    closer = threading.Timer(0.2, listener.close)
    closer.start()
    try:
        assert _sign_of(port) == "absent"
    finally:
        closer.join()


def test_a_listener_that_never_answers_is_unclear_and_a_closed_port_absent() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert _sign_of(port, handshake_timeout=0.2) == "unclear"
    assert _sign_of(port) == "absent"


def test_a_real_store_is_serving() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    assert _sign_of(store.port) == "serving"
