"""The worker side: a shared-memory slot table, one registration over a Unix socket, cheap arm/disarm."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import logging
import mmap
import os
import signal
import socket
import stat
import sys
import threading
import time
import weakref
from datetime import timedelta
from types import TracebackType
from typing import IO

from distinit._duration import to_seconds
from distinit.errors import WatchdogError
from distinit.watchdog import _directory, _dump, _proc, _slots
from distinit.watchdog._protocol import ENV_VAR, SOCKET_NAME, Identity, decode_reply, exchange_hello
from distinit.watchdog._slots import (
    H_ARMS,
    H_CLOSED,
    H_DUMPSIG,
    H_HWM,
    HEADER_WORDS,
    NSLOTS,
    S_ARMED_AT,
    S_DEADLINE,
    S_SCOPE,
    S_THREAD,
    SLOT_WORDS,
)

logger = logging.getLogger("distinit.watchdog")

# faulthandler's dump signal. A real-time signal: SIGUSR1/2 are often taken (NCCL, submitit, profilers).
DEFAULT_DUMP_SIGNAL = signal.SIGRTMIN + 6
HEARTBEAT_SLOT = 0
HEARTBEAT_SCOPE = "heartbeat"
# The heartbeat's deadline word, written on every beat().
_HEARTBEAT_DEADLINE = HEADER_WORDS + HEARTBEAT_SLOT * SLOT_WORDS + S_DEADLINE

_monotonic = time.monotonic
_get_ident = threading.get_ident
_live_clients: weakref.WeakSet[WatchdogClient] = weakref.WeakSet()
_hooks_installed = False


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        client._detach_after_fork()


def _close_at_exit() -> None:
    # A normal interpreter exit removes this process's files; os._exit and crashes leave them for the
    # server, which notes "exited while armed" and cleans up.
    for client in list(_live_clients):
        client.close()


def _track(client: WatchdogClient) -> None:
    global _hooks_installed
    _live_clients.add(client)
    if not _hooks_installed:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(_close_at_exit)
        _hooks_installed = True


def live_client_for(path: str) -> WatchdogClient | None:
    """This process's open client on the watchdog directory ``path``, if it has one."""
    real = os.path.realpath(path)
    return next((c for c in list(_live_clients) if c._usable and c._real_path == real), None)


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

    __module__ = "distinit.watchdog"  # its public home: reprs and pickles never name a private module

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

    Construction creates this process's slot table in the watchdog directory, registers with the server
    over its Unix socket (sending the ranks from ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``; which process we are,
    the server learns from the kernel, ``SO_PEERCRED``), then registers faulthandler on a dump signal so the
    server can get a stack even while the GIL is held in C code.

    After that, :meth:`expires`, :meth:`arm`, :meth:`disarm` and :meth:`beat` are memory stores into the
    table: no system call, they never block and never raise. Regions nest and may be used from many threads;
    each region owns its own slot. At most 1023 regions may be armed at once per process; beyond that a
    region runs unguarded and one warning is logged.

    With no server, the client fails open: one warning, the timers are still recorded, and a server started
    later on the same path adopts them. ``fail_closed=True`` raises :class:`~distinit.errors.WatchdogError`
    instead. Linux only.
    """

    __module__ = "distinit.watchdog"  # its public home: reprs and pickles never name a private module

    def __init__(
        self,
        path: str | None = None,
        *,
        fail_closed: bool = False,
        dump_stacks: bool = True,
        dump_signal: int = DEFAULT_DUMP_SIGNAL,
        connect_timeout: float | timedelta = 2.0,
    ) -> None:
        """Create the slot table and register with the server at ``path`` (``$DISTINIT_WATCHDOG`` when None).

        Raises:
            WatchdogError: this process already has an open client on ``path`` (one registration per
                process: use that client, or ``close()`` it first), or ``fail_closed=True`` and no server
                accepted this process.
        """
        timeout = to_seconds(connect_timeout, "connect_timeout")
        self.path = path or _directory.default_path()
        self._real_path = os.path.realpath(self.path)
        self._pid = os.getpid()
        other = live_client_for(self.path)
        if other is not None:
            raise WatchdogError(
                f"pid {self._pid} already has an open WatchdogClient on {self.path!r}",
                why="the server watches one slot table per process; a second client would replace the first "
                "one's table, and the regions armed through either would no longer be enforced",
                fix="use the existing client (configure(client) shares it with expires()), or close() it "
                "before creating a new one",
            )
        self.fail_closed = fail_closed
        self.registered = False
        self.overflows = 0
        self._start = _proc.start_time(self._pid) or 0
        self._closed = self._detached = False
        self._sock: socket.socket | None = None
        self._stack_fh: IO[bytes] | None = None
        self._stack_path: str | None = None
        self._dump_signal = 0
        self._slot_path: str | None = None
        self._hb_timeout: float | None = None
        problem = self._set_up(dump_stacks=dump_stacks, dump_signal=dump_signal, timeout=timeout)
        self.reason = problem or ""
        if problem is not None:
            self._fail_open(problem)
        _track(self)

    @property
    def _usable(self) -> bool:
        return not (self._closed or self._detached)

    # ----------------------------------------------------------------- set-up
    def _set_up(self, *, dump_stacks: bool, dump_signal: int, timeout: float) -> str | None:
        """Directory, table, registration, dump handler; the first problem met (None: registered)."""
        self._identity = Identity.from_env()
        problem = _directory.prepare(self.path)
        slot_path = os.path.join(self.path, _slots.slot_file_name(self._pid, self._start))
        table = None
        if problem is None:
            try:
                table = _slots.create_table(slot_path, self._pid, self._start, self._identity)
                self._slot_path = slot_path
            except OSError as exc:
                problem = f"cannot create the slot table {slot_path!r}: {exc}"
        # Without a file the table is anonymous memory: arming still works, nothing enforces it.
        self._use_table(table or _slots.create_table(None, self._pid, self._start))
        if problem is None:
            problem = self._register(timeout)
        # The stack file only once a server accepted us: a client that fails open must leave no empty
        # file behind when it is killed (nothing would clean it up). A server that adopts such a table
        # later kills without a dump.
        if problem is None and dump_stacks:
            self._install_dump(dump_signal)
        return problem

    def _use_table(self, mm: mmap.mmap) -> None:
        self._mm = mm
        self._q = memoryview(mm).cast("Q")
        self._d = memoryview(mm).cast("d")
        self._names = _slots.ScopeNames(mm)
        self._free = list(range(_slots.NSLOTS - 1, HEARTBEAT_SLOT, -1))
        self._hwm = 0

    def _fail_open(self, problem: str) -> None:
        if self.fail_closed:
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
            extra={"distinit": {"event": "watchdog.fail_open", "pid": self._pid, "path": self.path, "reason": problem}},
        )

    def _install_dump(self, dump_signal: int) -> None:
        stack_path = os.path.join(self.path, _slots.stack_file_name(self._pid, self._start))
        try:
            self._stack_fh = _dump.install(stack_path, dump_signal)
        except (OSError, ValueError, RuntimeError) as exc:
            logger.warning(
                "pid %d: no stack dumps before a watchdog kill: faulthandler.register(%d) failed: %s",
                self._pid,
                dump_signal,
                exc,
                extra={"distinit": {"event": "watchdog.no_dump", "pid": self._pid, "error": str(exc)}},
            )
            return
        self._stack_path = stack_path
        self._dump_signal = dump_signal
        self._q[H_DUMPSIG] = dump_signal

    def _register(self, timeout: float) -> str | None:
        sock_path = os.path.join(self.path, SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            reply = exchange_hello(sock, sock_path, self._identity)
        except OSError as exc:
            sock.close()
            return f"cannot reach the watchdog server at {sock_path!r}: {exc.strerror or exc}"
        answer = decode_reply(reply)
        if answer is None or answer.get("ok") is not True:
            sock.close()
            detail = answer.get("error") if answer is not None else f"malformed reply {reply[:80]!r}"
            return f"the watchdog server at {sock_path!r} refused this process: {detail}"
        self._sock = sock  # kept open: the server sees EOF when we go away
        self.registered = True
        return None

    def _detach_after_fork(self) -> None:
        # A forked child shares the parent's MAP_SHARED table: arms there would be charged to the parent.
        # The parent's files stay the parent's: the child must neither unlink them nor close its dump file.
        self._use_table(_slots.create_table(None, os.getpid(), 0))
        self._detached = True
        self._sock = None
        self._slot_path = self._stack_path = None
        self._stack_fh = None
        self._dump_signal = 0
        self.registered = False
        self.reason = "forked child of a registered process; create a new WatchdogClient in the child"

    # ----------------------------------------------------------------- scopes
    def _intern(self, scope: str) -> int:
        return self._names.intern(scope)

    def _frame_scope(self, depth: int) -> int:
        return self._names.of_frame(sys._getframe(depth + 1))

    # ----------------------------------------------------------------- hot path
    def _arm(self, after: float, scope_id: int) -> int:
        try:
            i = self._free.pop()  # atomic under the GIL: no lock on the hot path
        except IndexError:
            self._overflow()
            return -1
        now = _monotonic()
        b = HEADER_WORDS + i * SLOT_WORDS  # _slots.slot_base(i), inlined: this is the hot path
        q = self._q
        q[b + S_SCOPE] = scope_id
        q[b + S_THREAD] = _get_ident()
        d = self._d
        d[b + S_ARMED_AT] = now
        d[b + S_DEADLINE] = now + after  # last: the server reads a complete slot once it sees a deadline
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
        seconds = to_seconds(after, "after")
        sid = self._intern(scope) if scope is not None else self._frame_scope(1)
        return self._arm(seconds, sid)

    def disarm(self, handle: int) -> None:
        """Disarm the timer ``handle`` returned by :meth:`arm`; other regions stay armed. Never raises.

        Disarm each handle once: like a double free, a second disarm after the slot was reused would disarm
        the region now holding it (``expires`` regions cannot make this mistake).
        """
        if HEARTBEAT_SLOT < handle < NSLOTS:  # -1 (not armed) and foreign numbers are no-ops
            i = HEADER_WORDS + handle * SLOT_WORDS + S_DEADLINE
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
        seconds = to_seconds(after, "after")
        if scope is None:
            sid = self._frame_scope(1)
        else:
            cached = self._names.ids.get(scope)
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
        b = _slots.slot_base(HEARTBEAT_SLOT)
        self._q[b + S_SCOPE] = sid
        self._q[b + S_THREAD] = _get_ident()
        now = _monotonic()
        self._d[b + S_ARMED_AT] = now
        self._hb_timeout = seconds
        self._d[b + S_DEADLINE] = now + seconds
        if self._hwm < 1:
            self._hwm = 1
            self._q[H_HWM] = 1
        return Heartbeat(self)

    def beat(self) -> None:
        """Tell the server this process is alive (one memory store); a no-op outside liveness mode."""
        timeout = self._hb_timeout
        if timeout is not None:
            self._d[_HEARTBEAT_DEADLINE] = _monotonic() + timeout

    def stop_heartbeat(self) -> None:
        """Leave liveness mode."""
        self._hb_timeout = None
        self._d[_HEARTBEAT_DEADLINE] = 0.0

    # ----------------------------------------------------------------- teardown
    def close(self) -> None:
        """Disarm everything, unregister and remove this process's files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._hb_timeout = None
        self._q[H_CLOSED] = 1
        for i in range(int(self._q[H_HWM])):
            self._d[_slots.slot_base(i) + S_DEADLINE] = 0.0
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
            self._stack_fh.close()
            self._stack_fh = None
        if self._stack_path is not None:
            _unlink_if_empty(self._stack_path)
        self.registered = False
        _live_clients.discard(self)

    def __enter__(self) -> WatchdogClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _unlink_if_empty(path: str) -> None:
    """Remove ``path`` when it is an empty regular file (a stack file no dump was written to)."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(path)
