"""Registration over the Unix socket, without ever blocking the server thread.

Each accepted connection is non-blocking and has its own state: the bytes of the hello read so far and a
deadline. A peer that connects and sends nothing costs one entry, never a wait; at most
:data:`MAX_PENDING` wait at once (the oldest is dropped first) and each for at most
:data:`HANDSHAKE_TIMEOUT` seconds. Who the peer is comes from the kernel (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from distinit.errors import WatchdogError
from distinit.watchdog._protocol import HELLO, MAX_IDENTITY_BYTES, Identity, decode_identity, encode_reply

#: How long a connection may take to send its hello (clients send it right after connecting).
HANDSHAKE_TIMEOUT = 2.0
#: How many connections may wait for their hello at once.
MAX_PENDING = 64
#: The most connections accepted per wake-up, so a flood cannot starve deadline checks.
ACCEPT_BATCH = 256
_UCRED = struct.Struct("3i")

#: Called with (conn, pid, uid, identity) once the hello is complete; returns why the peer is refused, or
#: None after taking ownership of ``conn``.
OnHello = Callable[[socket.socket, int, int, Identity], "str | None"]


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of ``conn``, from the kernel."""
    pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def bind_listener(socket_path: str, directory: str) -> socket.socket:
    """Listen on ``socket_path`` (0600, non-blocking), after making sure no live server holds it.

    Raises:
        WatchdogError: another server answers on ``socket_path``.
    """
    if os.path.lexists(socket_path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(socket_path)
        except OSError:
            os.unlink(socket_path)  # stale: its server died
        else:
            raise WatchdogError(
                f"another watchdog server already serves {directory!r}",
                why="two servers on one path would each watch half the workers",
                fix="stop the other server, or give this one its own --path (and DISTINIT_WATCHDOG)",
            )
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(socket_path)
    finally:
        os.umask(old_umask)
    os.chmod(socket_path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


@dataclass
class _Pending:
    conn: socket.socket
    pid: int
    uid: int
    deadline: float
    received: bytes = b""


class Handshakes:
    """Accepts connections and completes each hello as its bytes arrive (selector callbacks)."""

    def __init__(
        self,
        listener: socket.socket,
        sel: selectors.BaseSelector,
        *,
        vet_peer: Callable[[int, int], str | None],
        on_hello: OnHello,
        on_refused: Callable[[int, int, str], None],
    ) -> None:
        """Serve ``listener`` through ``sel``; ``vet_peer(pid, uid)`` refuses a peer before its hello."""
        self._listener = listener
        self._sel = sel
        self._vet_peer = vet_peer
        self._on_hello = on_hello
        self._on_refused = on_refused
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order: oldest first
        sel.register(listener, selectors.EVENT_READ, self.accept)

    def accept(self) -> None:
        """Accept what is waiting (a bounded batch) and read each hello that has already arrived."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: try again on the next wake-up
                return
            conn.setblocking(False)
            try:
                pid, uid = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            problem = self._vet_peer(pid, uid)
            if problem is not None:
                self._refuse(conn, pid, uid, problem)
                continue
            self._wait_for_hello(_Pending(conn, pid, uid, time.monotonic() + HANDSHAKE_TIMEOUT))

    def _wait_for_hello(self, pending: _Pending) -> None:
        if len(self._pending) >= MAX_PENDING:
            oldest = next(iter(self._pending.values()))
            self._drop(oldest, f"more than {MAX_PENDING} connections waited for their hello; dropped the oldest")
        self._pending[pending.conn] = pending
        self._sel.register(pending.conn, selectors.EVENT_READ, functools.partial(self._readable, pending))
        self._readable(pending)  # clients send the hello at once: usually it is already here

    def _readable(self, pending: _Pending) -> None:
        try:
            chunk = pending.conn.recv(len(HELLO) - len(pending.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(pending, f"handshake failed: {exc.strerror or exc}")
            return
        pending.received += chunk
        if not chunk or not HELLO.startswith(pending.received):
            self._drop(pending, f"bad hello {pending.received[:16]!r}")
        elif pending.received == HELLO:
            self._forget(pending)
            identity = _identity_after_hello(pending.conn)
            problem = self._on_hello(pending.conn, pending.pid, pending.uid, identity)
            if problem is not None:
                self._refuse(pending.conn, pending.pid, pending.uid, problem)

    def expire(self, now: float) -> None:
        """Drop the connections whose hello is overdue."""
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            self._drop(pending, f"no hello within {HANDSHAKE_TIMEOUT} s")

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(pending.conn)

    def _drop(self, pending: _Pending, why: str) -> None:
        self._forget(pending)
        self._refuse(pending.conn, pending.pid, pending.uid, why)

    def _refuse(self, conn: socket.socket, pid: int, uid: int, why: str) -> None:
        self._on_refused(pid, uid, why)
        with contextlib.suppress(OSError):
            conn.send(encode_reply(ok=False, error=why))  # small, into an empty buffer: never blocks
        conn.close()

    def close(self) -> None:
        """Close every waiting connection (the listener is the caller's)."""
        for pending in list(self._pending.values()):
            self._forget(pending)
            pending.conn.close()


def _identity_after_hello(conn: socket.socket) -> Identity:
    """The identity line sent with the hello, if it is already here (it came in the same write).

    Never waits: a client that predates the identity line sends nothing more, and its ranks are unknown.
    """
    try:
        return decode_identity(conn.recv(MAX_IDENTITY_BYTES + 1))
    except OSError:  # BlockingIOError: nothing sent after the hello
        return Identity()
