"""The wire protocol between a worker's client and the server: where they meet and what they say.

A client connects to ``<directory>/sock`` and sends :data:`HELLO`; the server answers one JSON line
(:func:`encode_reply`), ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``, and keeps the connection
open: its end-of-file tells the server the client went away. Who the client is comes from the kernel
(``SO_PEERCRED``), never from a message.
"""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

#: The environment variable naming the watchdog directory (server and workers must agree on it).
ENV_VAR = "DISTINIT_WATCHDOG"
#: The server's Unix socket, inside the watchdog directory.
SOCKET_NAME = "sock"
#: What a client sends after connecting (the whole request).
HELLO = b"DWDG1\n"
#: The longest reply a client reads.
MAX_REPLY_BYTES = 4096


def encode_reply(*, ok: bool, **facts: Any) -> bytes:
    """One reply line: ``{"ok": ok, **facts}`` as JSON, newline-terminated."""
    return json.dumps({"ok": ok, **facts}).encode() + b"\n"


def decode_reply(raw: bytes) -> dict[str, Any] | None:
    """The reply a client read, or None when it is not one complete JSON object line."""
    if not raw.endswith(b"\n"):
        return None
    try:
        answer = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def exchange_hello(sock: socket.socket, sock_path: str) -> bytes:
    """The client's side: connect, send the hello, read the reply line (bounded by the socket's timeout).

    Raises:
        OSError: the server cannot be reached (or timed out).
    """
    sock.connect(sock_path)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(HELLO)  # a server refusing us may close first; its reply is still readable
    reply = b""
    while not reply.endswith(b"\n") and len(reply) < MAX_REPLY_BYTES:
        chunk = sock.recv(MAX_REPLY_BYTES)
        if not chunk:
            break
        reply += chunk
    return reply
