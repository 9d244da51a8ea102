"""One small TCP service per rank on the address gloo will use: the far end of ``reach``, ``clock``, ``bandwidth``.

One byte selects the reply: ``P`` ping, ``T`` wall time (repeatable), ``B`` + 8-byte length: a sink.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Mapping

from distinit.doctor import _netif

PING, TIME, BULK = b"P", b"T", b"B"
#: How long one accepted connection may stay idle before the listener drops it.
IDLE_TIMEOUT = 10.0
_CHUNK = 1 << 20


def gloo_address(environ: Mapping[str, str], hostname: str) -> str:
    """The address gloo binds: ``GLOO_SOCKET_IFNAME``'s first interface, else the hostname's IPv4 address."""
    names = [n.strip() for n in environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    if names:
        found = _netif.ipv4(names[0])
        if found:
            return found
    try:
        return str(socket.getaddrinfo(hostname, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return "127.0.0.1"


class Listener:
    """A daemon-threaded TCP server on ``address`` (port chosen by the kernel); close() stops it."""

    def __init__(self, address: str) -> None:
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.server.bind((address, 0))
        except OSError:  # the address is not ours (a stale /etc/hosts entry): named by `names`/`route`
            self.server.bind(("0.0.0.0", 0))
        self.server.listen(1024)
        self.server.settimeout(0.2)
        self.address = address
        self.port = int(self.server.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="distinit-doctor-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        conn.settimeout(IDLE_TIMEOUT)
        with conn:
            try:
                while command := conn.recv(1):
                    if command == PING:
                        conn.sendall(PING)
                    elif command == TIME:
                        conn.sendall(struct.pack("!d", time.time()))
                    elif command == BULK:
                        _drain(conn, struct.unpack("!Q", recv_exactly(conn, 8))[0])
                        conn.sendall(PING)
                    else:
                        return
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self.server.close()


def _drain(conn: socket.socket, size: int) -> None:
    while size:
        chunk = conn.recv(min(size, _CHUNK))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        size -= len(chunk)


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``conn`` (ConnectionError if it closes first)."""
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        data += chunk
    return data
