"""The worker side of the torch FileTimer drop-in: the request, the client, ``configure`` and ``expires``.

Same names, signatures and wire format as ``torch.distributed.elastic.timer`` (one JSON line per request
through the server's FIFO: ``version``, ``pid``, ``scope_id``, ``expiration_time`` as absolute epoch seconds,
-1 to release, ``signal``), so either side can be torch's. What differs from torch, on purpose:

* with distinit's server the FIFO is opened once and kept open, which makes ``acquire`` + ``release`` two
  ``write`` calls. The client tells that server apart by the marker it publishes beside its FIFO
  (:func:`publish_marker`), checked when it opens the FIFO. With any other reader it opens, writes and
  closes the FIFO for every request, as torch's client does: torch's server reads with a blocking
  ``readline()`` and checks its timers only between reads, so a FIFO held open by a hung worker would keep
  it from ever reaping that worker. A marker that is missing, stale or doubtful counts as "not distinit's";
* an acquire line also carries ``"start"``, the worker's start time from ``/proc/self/stat``, so the server
  can tell this process from a later one that reuses its pid (torch's server ignores unknown keys);
* with distinit's server, the client installs faulthandler on the dump signal, writing to
  ``<fifo>.<pid>.<start>.stack``, so the server can record the hung worker's Python stack before it sends
  the requested signal. The file is removed by ``close()``, at exit, and by the server once the worker is
  gone; with torch's server (which never asks for a dump) no handler and no file;
* the default scope is the caller's ``file#line`` (torch's ``inspect.stack()[1]`` names a line of
  ``contextlib.py``, so every default-scope region of a process shares one scope).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import fcntl
import functools
import json
import logging
import math
import os
import select
import signal as _signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Protocol

from distinit.watchdog import _dump
from distinit.watchdog._proc import start_time

logger = logging.getLogger("distinit.watchdog")

#: The signal the client's faulthandler dumps its stack on (the native client's, too).
DUMP_SIGNAL = _signal.SIGRTMIN + 6
#: The longest request line (torch's limit: one atomic FIFO write).
MAX_LINE_BYTES = select.PIPE_BUF
# torch's client retries opening the FIFO 10 times, 0.1 s apart, before raising BrokenPipeError.
_OPEN_TRIES = 10
_OPEN_PAUSE = 0.1
# fail_open: how long after a failed open before the next attempt (regions in between run unguarded).
_FAIL_OPEN_RETRY = 5.0
# How long a write waits in a full FIFO in which no room appears (the server reads nothing) before giving up.
_FULL_WAIT = 1.0
# The longest a write waits while room keeps appearing but other writers keep taking it (a busy, reading server).
_CONTENDED_WAIT = 30.0
# After finding no marker, how long before the next look (its failed open costs about as much as the
# open and close of the FIFO itself). Until then the reader is taken for torch's: the safe side.
_PROBE_EVERY = 1.0


def stack_path(file_path: str, pid: int, start: int) -> str:
    """Where worker ``pid`` (started at ``start`` ticks) writes its stack dump for the FIFO ``file_path``."""
    return f"{file_path}.{pid}.{start}.stack"


# -- the marker: "distinit's server reads this FIFO" -------------------------------------------------------
#
# torch's server must see every client close the FIFO after each request, distinit's need not (it polls), so
# the client keeps the FIFO open only where it knows the reader is distinit's. The proof is a marker beside
# the FIFO that names the FIFO's (st_dev, st_ino) and that the server holds an exclusive flock on for as long
# as it serves: a marker left by a server that died is unlocked, and while its server lives the FIFO's inode
# cannot be freed and reused by a later server's FIFO. torch's server replaces the FIFO (a new inode) and
# never writes a marker. Anything doubtful reads as "not distinit's": the client then behaves as torch's.

#: The marker's format name (the ``"server"`` key).
MARKER_FORMAT = "distinit.watchdog.elastic"
_MARKER_MAX_BYTES = 4096


def marker_path(file_path: str) -> str:
    """Where distinit's server publishes, beside the FIFO ``file_path``, that it reads that FIFO."""
    return f"{file_path}.distinit-server"


def publish_marker(file_path: str, fifo: os.stat_result) -> int:
    """Publish that this process serves the FIFO ``file_path`` (``fifo``: its ``stat``); the fd to hold.

    Writes ``<fifo>.distinit-server`` (0600, JSON: the FIFO's ``dev`` and ``ino``, this ``pid``) through a
    temporary name and a rename, so a client never reads half a marker, and holds an exclusive ``flock`` on
    it: the marker is live while the returned fd stays open. Publish it before the FIFO is opened for
    reading (a client can open the FIFO only once a reader has it open), so no client finds a FIFO without
    its marker. Undo with :func:`withdraw_marker`.

    Raises:
        OSError: the marker cannot be written (the client then treats the server as torch's: slower, safe).
    """
    path = marker_path(file_path)
    tmp = f"{path}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else can hold it
        doc = {"server": MARKER_FORMAT, "version": 1, "dev": fifo.st_dev, "ino": fifo.st_ino, "pid": os.getpid()}
        os.write(fd, json.dumps(doc).encode() + b"\n")
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        _remove_quietly(tmp)
        raise
    return fd


def withdraw_marker(file_path: str, fd: int) -> None:
    """Remove the marker published as ``fd`` (not a later server's at the same path) and release it."""
    with contextlib.suppress(OSError):
        held, there = os.fstat(fd), os.lstat(marker_path(file_path))
        if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
            os.unlink(marker_path(file_path))
    with contextlib.suppress(OSError):
        os.close(fd)


def served_by_distinit(file_path: str, fifo_fd: int) -> bool:
    """Whether distinit's server reads the FIFO open as ``fifo_fd`` (opened from ``file_path``).

    True only when the marker beside it is a regular file of this user (never followed through a link),
    names this very FIFO (device and inode) and is locked by a live server. Never raises: any doubt is False.
    """
    try:
        fd = os.open(marker_path(file_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > _MARKER_MAX_BYTES:
            return False
        doc = json.loads(os.read(fd, _MARKER_MAX_BYTES))
        fifo = os.fstat(fifo_fd)
        named = isinstance(doc, dict) and doc.get("server") == MARKER_FORMAT
        if not named or [doc.get("dev"), doc.get("ino")] != [fifo.st_dev, fifo.st_ino]:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # its server holds it: alive, and reading this FIFO
        return False  # nobody holds it: its server is gone (our shared lock goes with the close below)
    except (OSError, ValueError, RecursionError):
        return False
    finally:
        os.close(fd)


class TimerClient(Protocol):
    """What ``expires`` needs of a client: torch's ``TimerClient`` methods (any torch client fits)."""

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` until ``expiration_time`` (epoch seconds)."""

    def release(self, scope_id: str) -> None:
        """Disarm ``scope_id``."""


class FileTimerRequest:
    """One acquire (``expiration_time`` ≥ 0, epoch seconds) or release (< 0) request; torch's data object.

    Args:
        worker_pid: the process the timer guards.
        scope_id: the region's name; one timer per (pid, scope).
        expiration_time: absolute ``time.time()`` seconds; negative releases.
        signal: what the server sends on expiry (≤ 0: only log it).
    """

    __slots__ = ("expiration_time", "scope_id", "signal", "version", "worker_id")

    def __init__(self, worker_pid: int, scope_id: str, expiration_time: float, signal: int = 0) -> None:
        self.worker_id = worker_pid
        self.scope_id = scope_id
        self.expiration_time = expiration_time
        self.version = 1
        self.signal = signal

    @property
    def worker_pid(self) -> int:
        """The guarded process (torch's alias of ``worker_id``)."""
        return self.worker_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FileTimerRequest):
            return False
        return (self.worker_id, self.scope_id, self.expiration_time, self.version, self.signal) == (
            other.worker_id,
            other.scope_id,
            other.expiration_time,
            other.version,
            other.signal,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: as torch's

    def __repr__(self) -> str:
        return (
            f"FileTimerRequest(worker_pid={self.worker_id!r}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time!r}, signal={self.signal!r})"
        )

    def to_json(self) -> str:
        """The wire form: one JSON object (torch's keys and order)."""
        return json.dumps(
            {
                "version": self.version,
                "pid": self.worker_pid,
                "scope_id": self.scope_id,
                "expiration_time": self.expiration_time,
                "signal": self.signal,
            }
        )


class FileTimerClient:
    """Send timer requests to a ``FileTimerServer`` (distinit's or torch's) through its FIFO.

    Args:
        file_path: the FIFO the server created.
        signal: what the server sends the worker on expiry (default SIGKILL: exit status -9; ≤ 0: only log).
        fail_open: when no server is reading (no FIFO, nobody reading it, no room in it for 1 s), warn once and
            run the region unguarded instead of raising ``BrokenPipeError`` (torch's behaviour, the default).
        dump_stacks: with distinit's server, install faulthandler on the dump signal so the server can
            record this worker's stack (torch's server never asks for one: no handler, no file).

    With distinit's server (its marker names the FIFO: :func:`served_by_distinit`) the FIFO is opened once
    and kept open; with any other reader every request opens, writes and closes it, as torch's client does
    (torch's server reaps only once every writer has closed the FIFO).

    Raises:
        TypeError: ``signal`` is not an integer.
    """

    def __init__(
        self,
        file_path: str,
        signal: int = _signal.SIGKILL,
        *,
        fail_open: bool = False,
        dump_stacks: bool = True,
    ) -> None:
        if isinstance(signal, bool) or not isinstance(signal, int):
            raise TypeError(f"signal must be an int (e.g. signal.SIGKILL), got {signal!r}")
        self._file_path = file_path
        self.signal = int(signal)
        self._fail_open = fail_open
        self._dump_stacks = dump_stacks
        self._fd: int | None = None
        self._pid = -1
        self._prefix = b""
        self._stack: IO[bytes] | None = None
        self._stack_path = ""
        self._stack_pid = -1  # the process the dump handler was installed in (a fork child inherits it)
        self._start: int | None = None
        self._cleanup: Callable[[], None] = lambda: None
        self._warned = False
        self._retry_at = 0.0  # fail_open: no new attempt to open the FIFO before this (monotonic)
        self._probe_at = 0.0  # no new look for distinit's marker before this (monotonic)
        self._scopes: dict[str, bytes] = {}

    # -- the two calls torch's ``expires`` makes ------------------------------------------------------------

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` until ``expiration_time`` (epoch seconds), replacing this process's timer of that scope.

        Raises:
            BrokenPipeError: no server is reading the FIFO (unless ``fail_open``).
            RuntimeError: the request line is longer than ``select.PIPE_BUF`` (a very long scope id).
        """
        if self._pid != os.getpid():
            self._adopt_process()
        # "thread": the acquiring thread, so the server reads the right thread's frames in a multi-thread dump.
        line = b'%s%s, "thread": %d, "expiration_time": %s}\n'
        self._write(line % (self._prefix, self._scope(scope_id), threading.get_ident(), _number(expiration_time)))

    def release(self, scope_id: str) -> None:
        """Disarm ``scope_id`` (a scope that is not armed is a no-op on the server).

        Raises:
            BrokenPipeError: no server is reading the FIFO (unless ``fail_open``).
        """
        if self._pid != os.getpid():
            self._adopt_process()
        line = b'{"version": 1, "pid": %d, "scope_id": %s, "expiration_time": -1, "signal": 0}\n'
        self._write(line % (self._pid, self._scope(scope_id)))

    def _send_request(self, request: FileTimerRequest) -> None:
        """Send any request as it is (torch's tests forge pids with it); the line is torch's ``to_json()``."""
        if self._pid != os.getpid():
            self._adopt_process()
        self._write(request.to_json().encode() + b"\n")

    def close(self) -> None:
        """Close the FIFO and remove this client's dump handler and stack file (idempotent).

        A later request opens the FIFO again (and installs the dump handler again if the reader is
        distinit's server).
        """
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._drop_dump()

    # -- internals --------------------------------------------------------------------------------------------

    def _scope(self, scope_id: str) -> bytes:
        encoded = self._scopes.get(scope_id)
        if encoded is None:
            encoded = json.dumps(scope_id).encode()
            if len(self._scopes) < 4096:
                self._scopes[scope_id] = encoded
        return encoded

    def _adopt_process(self) -> None:
        """Bind to the current process (first use, or after a fork): pid, start time, stack dump handler."""
        pid = os.getpid()
        start = start_time(pid)
        self._pid, self._start = pid, start
        extra = b"" if start is None else b'"start": %d, ' % start
        # Key order is free in JSON: the scope and the time come last, so acquire fills one bytes template.
        self._prefix = b'{"version": 1, "pid": %d, %s"signal": %d, "scope_id": ' % (pid, extra, self.signal)
        if self._fd is not None:  # a fork child of a process served by distinit: its own dump file
            self._install_dump()

    def _install_dump(self) -> None:
        """Install the dump handler for this process, once (distinit's server reads the FIFO)."""
        if not self._dump_stacks or self._start is None or (self._stack is not None and self._stack_pid == self._pid):
            return
        self._drop_dump()
        path = stack_path(self._file_path, self._pid, self._start)
        try:
            self._stack = _dump.install(path, DUMP_SIGNAL)
        except (OSError, ValueError, RuntimeError) as exc:
            logger.debug("watchdog: no stack dumps for pid %d: %s", os.getpid(), exc)
            return
        self._stack_path, self._stack_pid = path, os.getpid()
        # Normal exit removes it; os._exit and kills leave it to distinit's server, which removes the stack
        # files of workers that are gone. The pid check: a fork child inherits this atexit entry.
        self._cleanup = functools.partial(_remove_own, path, self._stack_pid)
        atexit.register(self._cleanup)

    def _drop_dump(self) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        faulthandler.unregister(DUMP_SIGNAL)
        atexit.unregister(self._cleanup)
        if self._stack_pid == os.getpid():  # after a fork the file is the parent's, still in use: keep it
            _remove_quietly(self._stack_path)
        with contextlib.suppress(OSError):
            stack.close()

    def _write(self, line: bytes) -> None:
        # The line with its newline must fit one atomic FIFO write: a longer write can be cut short (O_NONBLOCK)
        # or interleaved with other workers' lines. torch checks the JSON without its newline (one byte more).
        if len(line) > MAX_LINE_BYTES:
            raise RuntimeError(
                f"FileTimerRequest larger than {MAX_LINE_BYTES} bytes is not supported: {line[:200]!r}..."
            )
        for attempt in (0, 1):
            fd, kept = self._fd, True
            if fd is None:
                if time.monotonic() < self._retry_at:
                    return
                opened = self._connect()
                if opened is None:
                    return
                fd, kept = opened
            try:
                os.write(fd, line)
                return
            except BlockingIOError:
                if not self._write_when_room(fd, line):
                    self._unavailable(f"the FIFO had no room for {_FULL_WAIT:g} s: the server is not reading it")
                return
            except OSError:  # EPIPE: the server went away; its successor made a new FIFO: reopen once
                if kept:
                    self._forget(fd)
                if attempt:
                    self._unavailable("nobody reads the FIFO")
                    return
            finally:
                if not kept:  # torch's reader: close after every request, as torch's client does
                    os.close(fd)

    def _connect(self) -> tuple[int, bool] | None:
        """Open the FIFO: (fd, kept open). Kept only for distinit's server; None when failing open.

        The server is checked when the FIFO is opened (with torch's server, at most once a second: every
        request opens it), so a server that replaced the FIFO is told apart again.
        """
        fd = self._open()
        if fd is None:
            return None
        now = time.monotonic()
        distinit = now >= self._probe_at and served_by_distinit(self._file_path, fd)
        if not distinit:
            if now >= self._probe_at:
                self._probe_at = now + _PROBE_EVERY
            self._drop_dump()  # torch's server never asks for a dump, nor removes the file
            return fd, False
        self._install_dump()  # before the request is sent: the server may dump as soon as it reads it
        kept = self._fd
        if kept is None:
            self._fd = fd
            return fd, True
        os.close(fd)  # another thread kept one meanwhile: share it
        return kept, True

    def _forget(self, fd: int) -> None:
        """Close the kept FIFO ``fd`` (its reader went away), unless another thread replaced it already."""
        if self._fd == fd:
            self._fd = None
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    def _write_when_room(fd: int, line: bytes) -> bool:
        """Write ``line`` once the full FIFO has room; False when no room appeared for _FULL_WAIT.

        Other threads and workers write to the same FIFO: room seen by poll can be taken before this
        write, so it waits again (a single retry raised BrokenPipeError from a busy, healthy server). Room
        that appears is the server reading, so each time it does the _FULL_WAIT starts over: a write that
        keeps losing the room to other writers was given up after 1 s, though the server was reading
        (eight threads on a loaded machine, issue 34's stress round). _CONTENDED_WAIT bounds the whole wait.
        """
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        now = time.monotonic()
        cap = now + _CONTENDED_WAIT
        deadline = now + _FULL_WAIT
        while (left := min(deadline, cap) - time.monotonic()) > 0:
            if poller.poll(max(1, math.ceil(left * 1000))):
                deadline = time.monotonic() + _FULL_WAIT  # room appeared: the server reads
            try:
                os.write(fd, line)
            except BlockingIOError:
                continue
            return True
        return False

    def _open(self) -> int | None:
        """Open the FIFO for writing (torch: 10 tries 0.1 s apart); None when failing open."""
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        reason = ""
        tries = 1 if self._fail_open else _OPEN_TRIES  # failing open must not cost a second per region
        for attempt in range(tries):
            try:
                fd = os.open(self._file_path, flags)
            except OSError as exc:
                reason = exc.strerror or str(exc)
            else:
                st = os.fstat(fd)
                if stat.S_ISFIFO(st.st_mode) and st.st_uid == os.geteuid():
                    return fd
                os.close(fd)
                reason = "it is not a FIFO of this user (refused)"
            if attempt < tries - 1:
                time.sleep(_OPEN_PAUSE)
        self._unavailable(reason)
        return None

    def _unavailable(self, reason: str) -> None:
        what = (
            f"Could not send the FileTimerRequest because FileTimerServer is not available: "
            f"{self._file_path!r} (pid {os.getpid()}): {reason}"
        )
        if not self._fail_open:
            raise BrokenPipeError(what)
        self._retry_at = time.monotonic() + _FAIL_OPEN_RETRY
        if not self._warned:
            self._warned = True
            logger.warning(
                "%s; fail_open: running unguarded", what, extra={"distinit": {"event": "watchdog.fail_open"}}
            )


def _number(value: float) -> bytes:
    """A JSON number as ``json.dumps`` writes it (``repr`` is the same text for finite floats, and faster)."""
    if type(value) is float and value - value == 0.0:
        return repr(value).encode()
    return json.dumps(value).encode()


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _remove_own(path: str, pid: int) -> None:
    """At exit: remove ``path`` if this is still process ``pid`` (a fork child runs its parent's atexit list)."""
    if os.getpid() == pid:
        _remove_quietly(path)


_timer_client: TimerClient | None = None


def configure(timer_client: TimerClient | None) -> None:
    """Make ``timer_client`` the one ``expires()`` uses when given none (``None`` unsets it)."""
    global _timer_client
    _timer_client = timer_client


@contextlib.contextmanager
def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> Iterator[None]:
    """Guard the block: the worker may be reaped if it is still inside ``after`` seconds from now.

    ``scope`` defaults to the caller's ``file#line``; a region re-entered with the same scope (recursion)
    replaces its timer and the inner exit releases it, as torch's does.

    Raises:
        RuntimeError: no ``client`` was passed and none was configured (torch's error).
    """
    if client is None:
        if _timer_client is None:
            raise RuntimeError(
                "Configure timer client before using countdown timers: call "
                "distinit.watchdog.elastic.configure(FileTimerClient(path)) first, or pass client=."
            )
        client = _timer_client
    if scope is None:
        caller = sys._getframe(2)  # 0: this generator, 1: contextlib's __enter__, 2: the with statement
        scope = f"{caller.f_code.co_filename}#{caller.f_lineno}"
    client.acquire(scope, time.time() + after)
    try:
        yield
    finally:
        client.release(scope)


# Their public home: reprs and pickles name distinit.watchdog.elastic, never this private module.
for _public in (TimerClient, FileTimerRequest, FileTimerClient):
    _public.__module__ = "distinit.watchdog.elastic"
