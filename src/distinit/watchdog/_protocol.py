"""The wire protocol between a worker's client and the server: where they meet and what they say.

A client connects to ``<directory>/sock`` and sends :data:`HELLO`, followed in the same write by one JSON
line with its launcher identity (:func:`encode_identity`: ``{"rank": 3, "local_rank": 1, "world_size": 4}``);
the server answers one JSON line (:func:`encode_reply`), ``{"ok": true, ...}`` or ``{"ok": false, "error":
"..."}``, and keeps the connection open: its end-of-file tells the server the client went away.

The identity line is compatible both ways: a server that predates it reads exactly :data:`HELLO` and ignores
the bytes after it, and a client that predates it sends none (its ranks are then unknown). Which process the
client is (pid, uid) comes from the kernel (``SO_PEERCRED``), never from a message; the ranks are what the
worker says, used only to name it in events and to judge which rank hung first.

Reads launcher variables itself: a worker's identity (``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ...) is read
without ever raising, from this process or from another's ``/proc/<pid>/environ``, where ``env_from_scheduler``
would refuse a partial or contradictory environment; it only names a worker and never decides the world.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distinit.watchdog._proc import read_environ

#: The environment variable naming the watchdog directory (server and workers must agree on it).
ENV_VAR = "DISTINIT_WATCHDOG"
#: The server's Unix socket, inside the watchdog directory.
SOCKET_NAME = "sock"
#: What a client sends after connecting (the whole request).
HELLO = b"DWDG1\n"
#: The longest reply a client reads.
MAX_REPLY_BYTES = 4096
#: The longest identity line a server reads after the hello.
MAX_IDENTITY_BYTES = 256
# Where each identity field comes from, first set wins: torchrun/distinit, then Slurm, then Open MPI.
_IDENTITY_ENV = {
    "rank": ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"),
    "local_rank": ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "world_size": ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"),
}


@dataclass(frozen=True)
class Identity:
    """A worker's place in its job, as its launcher told it (None: unknown)."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Identity:
        """Read RANK/LOCAL_RANK/WORLD_SIZE (or the Slurm/Open MPI equivalents); malformed values are unknown."""
        found: dict[str, int | None] = {}
        for field_name, names in _IDENTITY_ENV.items():
            raw = next((environ[n].strip() for n in names if environ.get(n, "").strip()), "")
            found[field_name] = _small_int(int(raw)) if raw.isascii() and raw.isdigit() else None
        return cls(**found)

    @classmethod
    def from_proc(cls, pid: int) -> Identity | None:
        """The identity in process ``pid``'s environment as it was at exec (``/proc/<pid>/environ``).

        None when it cannot be read (another user, a non-dumpable process, gone) or is over 1 MiB. This is
        the environment the process *started* with: a rank exported later (``os.environ[...] = ...``) is not
        in it, so only a value present here and different from the claimed one is a disagreement.
        """
        environ = read_environ(pid)
        return None if environ is None else cls.from_env(environ)

    @classmethod
    def from_facts(cls, facts: Mapping[str, object]) -> Identity:
        """The ``rank``, ``local_rank`` and ``world_size`` a worker sent (JSON); anything malformed is unknown."""
        return cls(**{k: _small_int(facts.get(k)) for k in _IDENTITY_ENV})

    def disagreement(self, pid: int, environ: Identity | None) -> str:
        """Why the ranks this worker claimed contradict its environment ``environ``, or ``""`` when they do not."""
        if environ is None:
            return ""
        clashes = [
            f"{name} {claimed} but its environment says {actual}"
            for name, claimed, actual in (
                ("RANK", self.rank, environ.rank),
                ("LOCAL_RANK", self.local_rank, environ.local_rank),
                ("WORLD_SIZE", self.world_size, environ.world_size),
            )
            if claimed is not None and actual is not None and claimed != actual
        ]
        return f"pid {pid} registered as {', '.join(clashes)} (/proc/{pid}/environ)" if clashes else ""

    def label(self) -> str:
        """``RANK 3`` (or ``rank unknown``), for log lines."""
        return "rank unknown" if self.rank is None else f"RANK {self.rank}"


def _small_int(value: object) -> int | None:
    """A non-negative int below 2**31 from an identity field, None for anything else (bool included)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        return value
    return None


def encode_identity(identity: Identity) -> bytes:
    """The identity line a client sends right after :data:`HELLO` (only the known fields)."""
    known = {k: v for k, v in vars(identity).items() if v is not None}
    return json.dumps(known, separators=(",", ":")).encode() + b"\n"


def decode_identity(raw: bytes) -> Identity:
    """The identity in the bytes that followed the hello; unknown fields for anything malformed or absent."""
    line, newline, _ = raw.partition(b"\n")
    if not newline or len(line) > MAX_IDENTITY_BYTES:
        return Identity()
    try:
        facts = json.loads(line.decode("utf-8"))
    except ValueError:
        return Identity()
    if not isinstance(facts, dict):
        return Identity()
    return Identity.from_facts(facts)


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


def exchange_hello(sock: socket.socket, sock_path: str, identity: Identity | None = None) -> bytes:
    """The client's side: connect, send the hello and identity, read the reply (bounded by the socket's timeout).

    Raises:
        OSError: the server cannot be reached (or timed out).
    """
    sock.connect(sock_path)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        # One write, so the server reads the identity line without waiting for it. A server refusing us
        # may close first; its reply is still readable.
        sock.sendall(HELLO + encode_identity(identity or Identity()))
    reply = b""
    while not reply.endswith(b"\n") and len(reply) < MAX_REPLY_BYTES:
        chunk = sock.recv(MAX_REPLY_BYTES)
        if not chunk:
            break
        reply += chunk
    return reply
