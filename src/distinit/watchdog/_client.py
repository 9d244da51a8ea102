"""The worker side: a shared-memory slot table, one registration over a Unix socket, cheap arm/disarm."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref
from datetime import timedelta
from types import CodeType, TracebackType
from typing import IO

from distinit.errors import WatchdogError
from distinit.watchdog import _proc, _slots
from distinit.watchdog._slots import H_ARMS, H_CLOSED, H_DUMPSIG, H_HWM, H_NSCOPES, HEADER_WORDS, SLOT_WORDS

logger = logging.getLogger("distinit.watchdog")

ENV_VAR = "DISTINIT_WATCHDOG"
SOCKET_NAME = "sock"
HELLO = b"DWDG1\n"
MAX_REPLY_BYTES = 4096
# faulthandler's dump signal. A real-time signal: SIGUSR1/2 are often taken (NCCL, submitit, profilers).
DEFAULT_DUMP_SIGNAL = signal.SIGRTMIN + 6
HEARTBEAT_SLOT = 0
HEARTBEAT_SCOPE = "heartbeat"

_monotonic = time.monotonic
_get_ident = threading.get_ident
_live_clients: weakref.WeakSet[WatchdogClient] = weakref.WeakSet()
_fork_hook_installed = False


def default_path() -> str:
    """The watchdog directory: ``$DISTINIT_WATCHDOG``, else ``/dev/shm/distinit-watchdog-<uid>``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"distinit-watchdog-{os.geteuid()}")


def to_seconds(after: float | timedelta, name: str = "after") -> float:
    """Normalise a duration to float seconds > 0.

    Raises:
        TypeError: not a number or timedelta.
        ValueError: not finite and positive.
    """
    if isinstance(after, timedelta):
        after = after.total_seconds()
    if isinstance(after, bool) or not isinstance(after, (int, float)):
        raise TypeError(f"{name} must be seconds (float) or a timedelta, got {type(after).__name__}")
    seconds = float(after)
    if not 0.0 < seconds < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {after!r}")
    return seconds


def private_dir_problem(path: str) -> str | None:
    """Why ``path`` is not a private watchdog directory of this user (None if it is one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path!r} does not exist"
    except OSError as exc:
        return f"cannot inspect {path!r}: {exc.strerror or exc}"
    if not os.path.isdir(path) or os.path.islink(path):
        return f"{path!r} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path!r} belongs to uid {st.st_uid}, not to this process's uid {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"{path!r} has mode {st.st_mode & 0o777:o}; the watchdog needs 0700"
    return None


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        client._detach_after_fork()


def _close_at_exit() -> None:
    # A normal interpreter exit removes this process's files; os._exit and crashes leave them for the
    # server, which notes "exited while armed" and cleans up.
    for client in list(_live_clients):
        client.close()


class _Region:
    """One ``with client.expires(...)`` region: arms on enter, disarms its own slot on exit."""

    __slots__ = ("_after", "_client", "_handle", "_scope_id")

    def __init__(self, client: WatchdogClient, after: float, scope_id: int) -> None:
        self._client = client
        self._after = after
        self._scope_id = scope_id
        self._handle = -1

    def __enter__(self) -> _Region:
        self._handle = self._client._arm(self._after, self._scope_id)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client.disarm(self._handle)
        self._handle = -1


class Heartbeat:
    """Liveness mode of one client: the worker dies if it does not :meth:`beat` for ``timeout`` seconds."""

    def __init__(self, client: WatchdogClient) -> None:
        self._client = client

    def beat(self) -> None:
        """Push the deadline ``timeout`` seconds ahead (one memory store)."""
        self._client.beat()

    def stop(self) -> None:
        """Leave liveness mode."""
        self._client.stop_heartbeat()

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class WatchdogClient:
    """A worker's connection to the watchdog server on this host.

    Construction creates this process's slot table in the watchdog directory, registers faulthandler on a
    dump signal (so the server can get a stack even while the GIL is held in C code), and registers with the
    server over its Unix socket; the server learns who we are from the kernel (``SO_PEERCRED``), not from us.

    After that, :meth:`expires`, :meth:`arm`, :meth:`disarm` and :meth:`beat` are memory stores into the
    table: no system call, they never block and never raise. Regions nest and may be used from many threads;
    each region owns its own slot. At most 1023 regions may be armed at once per process; beyond that a
    region runs unguarded and one warning is logged.

    With no server, the client fails open: one warning, the timers are still recorded, and a server started
    later on the same path adopts them. ``fail_closed=True`` raises :class:`~distinit.errors.WatchdogError`
    instead. Linux only.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        fail_closed: bool = False,
        dump_stacks: bool = True,
        dump_signal: int = DEFAULT_DUMP_SIGNAL,
        connect_timeout: float = 2.0,
    ) -> None:
        """Create the slot table and register with the server at ``path`` (``$DISTINIT_WATCHDOG`` when None).

        Raises:
            WatchdogError: ``fail_closed=True`` and no server accepted this process.
        """
        global _fork_hook_installed
        self.path = path or default_path()
        self.fail_closed = fail_closed
        self.registered = False
        self.overflows = 0
        self.reason = ""
        self._pid = os.getpid()
        self._start = _proc.start_time(self._pid) or 0
        self._lock = threading.Lock()
        self._scopes: dict[str, int] = {}
        self._frame_scopes: dict[tuple[CodeType, int], int] = {}
        self._free = list(range(_slots.NSLOTS - 1, HEARTBEAT_SLOT, -1))
        self._hwm = 0
        self._hb_timeout: float | None = None
        self._sock: socket.socket | None = None
        self._stack_fh: IO[bytes] | None = None
        self._dump_signal = 0
        self._slot_path: str | None = None
        self._closed = False

        problem = self._prepare_dir()
        slot_path = os.path.join(self.path, _slots.slot_file_name(self._pid, self._start))
        if problem is None:
            try:
                self._mm = _slots.create_table(slot_path, self._pid, self._start)
                self._slot_path = slot_path
            except OSError as exc:
                problem = f"cannot create the slot table {slot_path!r}: {exc}"
        if self._slot_path is None:
            self._mm = _slots.create_table(None, self._pid, self._start)
        self._q = memoryview(self._mm).cast("Q")
        self._d = memoryview(self._mm).cast("d")
        self._scopes[_slots.OVERFLOW_SCOPE] = 0
        if problem is None and dump_stacks:
            self._install_dump(dump_signal)
        if problem is None:
            problem = self._register(connect_timeout)
        self.reason = problem or ""
        if problem is not None:
            if fail_closed:
                self.close()
                raise WatchdogError(
                    f"pid {self._pid}: no watchdog protection: {problem}",
                    why="no `distinit watchdog serve` (or WatchdogServer) is running on this path, "
                    "or it belongs to another user",
                    fix=f"start `distinit watchdog serve --path {self.path}` first, set {ENV_VAR} to it, "
                    "or pass fail_closed=False to run unguarded",
                )
            logger.warning(
                "pid %d: watchdog client fails open: %s; timers are recorded but nothing enforces them "
                "until a server starts on %s (it adopts them)",
                self._pid,
                problem,
                self.path,
                extra={
                    "distinit": {
                        "event": "watchdog.fail_open",
                        "pid": self._pid,
                        "path": self.path,
                        "reason": problem,
                    }
                },
            )
        _live_clients.add(self)
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            atexit.register(_close_at_exit)
            _fork_hook_installed = True

    # ----------------------------------------------------------------- set-up
    def _prepare_dir(self) -> str | None:
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            return f"cannot create the watchdog directory {self.path!r}: {exc}"
        return private_dir_problem(self.path)

    def _install_dump(self, dump_signal: int) -> None:
        stack_path = os.path.join(self.path, _slots.stack_file_name(self._pid, self._start))
        try:
            fd = os.open(stack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            self._stack_fh = os.fdopen(fd, "ab", buffering=0)
            faulthandler.register(dump_signal, file=self._stack_fh, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError) as exc:
            logger.warning(
                "pid %d: no stack dumps before a watchdog kill: faulthandler.register(%d) failed: %s",
                self._pid,
                dump_signal,
                exc,
                extra={"distinit": {"event": "watchdog.no_dump", "pid": self._pid, "error": str(exc)}},
            )
            return
        self._dump_signal = dump_signal
        self._q[H_DUMPSIG] = dump_signal

    def _register(self, timeout: float) -> str | None:
        sock_path = os.path.join(self.path, SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sock_path)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(HELLO)  # a server refusing us may close first; its reply is still readable
            reply = b""
            while not reply.endswith(b"\n") and len(reply) < MAX_REPLY_BYTES:
                chunk = sock.recv(MAX_REPLY_BYTES)
                if not chunk:
                    break
                reply += chunk
        except OSError as exc:
            sock.close()
            return f"cannot reach the watchdog server at {sock_path!r}: {exc.strerror or exc}"
        try:
            answer = json.loads(reply.decode("utf-8")) if reply.endswith(b"\n") else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            sock.close()
            detail = answer.get("error") if isinstance(answer, dict) else f"malformed reply {reply[:80]!r}"
            return f"the watchdog server at {sock_path!r} refused this process: {detail}"
        self._sock = sock  # kept open: the server sees EOF when we go away
        self.registered = True
        return None

    def _detach_after_fork(self) -> None:
        # A forked child shares the parent's MAP_SHARED table: arms there would be charged to the parent.
        self._mm = _slots.create_table(None, os.getpid(), 0)
        self._q = memoryview(self._mm).cast("Q")
        self._d = memoryview(self._mm).cast("d")
        self._free = list(range(_slots.NSLOTS - 1, HEARTBEAT_SLOT, -1))
        self._hwm = 0
        self._lock = threading.Lock()
        self._scopes = {_slots.OVERFLOW_SCOPE: 0}
        self._frame_scopes = {}
        self._sock = None
        self._slot_path = None
        self.registered = False
        self.reason = "forked child of a registered process; create a new WatchdogClient in the child"

    # ----------------------------------------------------------------- scopes
    def _intern(self, scope: str) -> int:
        with self._lock:
            sid = self._scopes.get(scope)
            if sid is not None:
                return sid
            n = int(self._q[H_NSCOPES])
            if n >= _slots.NSCOPES:
                return 0
            raw = _slots.encode_scope(scope)
            off = _slots.SCOPES_OFFSET + n * _slots.SCOPE_BYTES
            self._mm[off : off + 1 + len(raw)] = bytes([len(raw)]) + raw
            self._q[H_NSCOPES] = n + 1
            self._scopes[scope] = n
            return n

    def _frame_scope(self, depth: int) -> int:
        frame = sys._getframe(depth + 1)
        key = (frame.f_code, frame.f_lineno)
        sid = self._frame_scopes.get(key)
        if sid is None:
            sid = self._intern(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            self._frame_scopes[key] = sid
        return sid

    # ----------------------------------------------------------------- hot path
    def _arm(self, after: float, scope_id: int) -> int:
        try:
            i = self._free.pop()  # atomic under the GIL: no lock on the hot path
        except IndexError:
            self._overflow()
            return -1
        now = _monotonic()
        b = HEADER_WORDS + i * SLOT_WORDS
        q = self._q
        q[b + 2] = scope_id
        q[b + 3] = _get_ident()
        d = self._d
        d[b + 1] = now
        d[b] = now + after  # last: the server reads a complete slot once it sees a deadline
        if i >= self._hwm:
            self._hwm = i + 1
            q[H_HWM] = i + 1
        q[H_ARMS] += 1
        return i

    def _overflow(self) -> None:
        self.overflows += 1
        if self.overflows == 1:
            logger.warning(
                "pid %d: more than %d watchdog regions armed at once; the extra ones run unguarded",
                self._pid,
                _slots.NSLOTS - 1,
                extra={"distinit": {"event": "watchdog.overflow", "pid": self._pid}},
            )

    def arm(self, after: float | timedelta, scope: str | None = None) -> int:
        """Arm a timer ``after`` seconds from now; returns a handle for :meth:`disarm` (-1: not armed).

        ``scope`` names the region in events; the default is the caller's ``file:line``.

        Raises:
            TypeError: ``after`` is not a number of seconds.
            ValueError: ``after`` is not finite and positive.
        """
        seconds = to_seconds(after)
        sid = self._intern(scope) if scope is not None else self._frame_scope(1)
        return self._arm(seconds, sid)

    def disarm(self, handle: int) -> None:
        """Disarm the timer ``handle`` returned by :meth:`arm`; other regions stay armed. Never raises.

        Disarm each handle once: like a double free, a second disarm after the slot was reused would disarm
        the region now holding it (``expires`` regions cannot make this mistake).
        """
        if handle > HEARTBEAT_SLOT:
            i = HEADER_WORDS + handle * SLOT_WORDS
            if self._d[i] != 0.0:  # already free: do not hand the slot out twice
                self._d[i] = 0.0
                self._free.append(handle)

    def expires(self, after: float | timedelta, scope: str | None = None) -> _Region:
        """A context manager: the server kills this process if the region runs ``after`` s past entry.

        Regions nest, and each thread's regions are independent. The default ``scope`` is the caller's
        ``file:line`` (found with ``sys._getframe``, cached).

        Raises:
            TypeError: ``after`` is not a number of seconds.
            ValueError: ``after`` is not finite and positive.
        """
        seconds = to_seconds(after)
        if scope is None:
            sid = self._frame_scope(1)
        else:
            cached = self._scopes.get(scope)
            sid = self._intern(scope) if cached is None else cached
        return _Region(self, seconds, sid)

    def _expires_at_depth(self, after: float, scope: str | None, depth: int) -> _Region:
        sid = self._intern(scope) if scope is not None else self._frame_scope(depth + 1)
        return _Region(self, after, sid)

    # ----------------------------------------------------------------- heartbeat
    def heartbeat(self, timeout: float | timedelta) -> Heartbeat:
        """Enter liveness mode: the server kills this process if :meth:`beat` is not called for ``timeout`` s.

        Raises:
            TypeError: ``timeout`` is not a number of seconds.
            ValueError: ``timeout`` is not finite and positive.
        """
        seconds = to_seconds(timeout, "timeout")
        sid = self._intern(HEARTBEAT_SCOPE)
        b = HEADER_WORDS + HEARTBEAT_SLOT * SLOT_WORDS
        self._q[b + 2] = sid
        self._q[b + 3] = _get_ident()
        now = _monotonic()
        self._d[b + 1] = now
        self._hb_timeout = seconds
        self._d[b] = now + seconds
        if self._hwm < 1:
            self._hwm = 1
            self._q[H_HWM] = 1
        return Heartbeat(self)

    def beat(self) -> None:
        """Tell the server this process is alive (one memory store); a no-op outside liveness mode."""
        timeout = self._hb_timeout
        if timeout is not None:
            self._d[HEADER_WORDS] = _monotonic() + timeout

    def stop_heartbeat(self) -> None:
        """Leave liveness mode."""
        self._hb_timeout = None
        self._d[HEADER_WORDS] = 0.0

    # ----------------------------------------------------------------- teardown
    def close(self) -> None:
        """Disarm everything, unregister and remove this process's files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._hb_timeout = None
        self._q[H_CLOSED] = 1
        hwm = int(self._q[H_HWM])
        for i in range(hwm):
            self._d[HEADER_WORDS + i * SLOT_WORDS] = 0.0
        if self._slot_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._slot_path)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._dump_signal:
            with contextlib.suppress(ValueError, RuntimeError):
                faulthandler.unregister(self._dump_signal)
        if self._stack_fh is not None:
            stack_path = self._stack_fh.name
            self._stack_fh.close()
            with contextlib.suppress(OSError, TypeError):
                if os.path.getsize(stack_path) == 0:
                    os.unlink(stack_path)
        self.registered = False
        _live_clients.discard(self)

    def __enter__(self) -> WatchdogClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
