"""The watchdog server: its lifecycle and its one thread's loop, wiring registration, scan and enforcement."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from distinit._duration import to_seconds, wait_bound
from distinit.errors import WatchdogError
from distinit.watchdog import _directory, _proc, _scan
from distinit.watchdog._enforce import Enforcer
from distinit.watchdog._events import EventName, EventSink, WatchdogEvent
from distinit.watchdog._handshake import Handshakes, bind_listener
from distinit.watchdog._ladder import LadderConfig
from distinit.watchdog._protocol import ENV_VAR, SOCKET_NAME, Identity, encode_reply
from distinit.watchdog._registry import Registry
from distinit.watchdog._worker import Worker

logger = logging.getLogger("distinit.watchdog")

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the NUL
# A failing loop iteration is logged at most this often (the loop itself never stops).
_LOOP_ERROR_LOG_INTERVAL = 5.0


class WatchdogServer:
    """Kills exactly the worker whose armed region overran its deadline, after dumping its stack.

    Workers (:class:`~distinit.watchdog.WatchdogClient`) register over a Unix socket in the private
    directory ``path`` (mode 0700, socket 0600). The server takes each peer's pid and uid from the kernel
    (``SO_PEERCRED``), holds a pidfd on it (or its pid and procfs start time, re-checked before every
    signal), and reads the worker's slot table into its own memory. It only ever signals registered,
    verified, live processes of its own user, and never its own process or its parent.

    One thread sleeps until the nearest deadline, at most ``resolution`` seconds (20 ms by default), reads
    the tables and, for an expired region, runs the ladder in its own thread: stack dump (faulthandler in
    the worker, written to ``<path>/<pid>.<start>.stack``) → SIGCONT → SIGTERM → ``grace`` → SIGKILL →
    verify death, or report the worker unkillable (D-state). Each outcome is an event (logger
    ``distinit.watchdog``, optional JSONL file ``events``) passed to ``on_expire``. Workers of one job that
    expire together (within ``group_window``) are judged first: the one running its own code is named the
    culprit (``watchdog.verdict``) and killed first, those blocked in a collective ``victim_hold`` later.

    Slot tables outlive the server: a server restarted on the same path adopts the table of every live
    worker that still has it mapped, and enforces deadlines armed before the restart. Linux only.
    """

    __module__ = "distinit.watchdog"  # its public home: reprs and pickles never name a private module

    def __init__(
        self,
        path: str | None = None,
        *,
        grace: float | timedelta = 5.0,
        dump_stacks: bool = True,
        on_expire: Callable[[WatchdogEvent], None] | None = None,
        events: str | None = None,
        kill_group: bool = False,
        resolution: float | timedelta = 0.02,
        dump_timeout: float | timedelta = 0.5,
        verify_timeout: float | timedelta = 5.0,
        use_pidfd: bool = True,
        group_window: float | timedelta = 1.0,
        victim_hold: float | timedelta = 2.0,
    ) -> None:
        """Configure a server for ``path`` (``$DISTINIT_WATCHDOG`` or a per-user, per-job default when None).

        Raises:
        ``group_window`` and ``victim_hold`` steer how workers of one job that expire together are judged
        (``docs/watchdog.md``, "Culprit and victims"): a worker whose region expires waits up to
        ``group_window`` seconds for the other workers whose deadlines are that close (0: never, each is
        killed alone at once); the culprit is killed first, the victims ``victim_hold`` seconds later.

        Raises:
            TypeError: a duration is not a number of seconds or a timedelta.
            ValueError: a negative or non-finite ``grace``/``group_window``/``victim_hold``, or a
                non-positive ``resolution``/timeouts.
        """
        self.ladder = LadderConfig(
            grace=to_seconds(grace, "grace", allow_zero=True),
            dump_stacks=dump_stacks,
            kill_group=kill_group,
            dump_timeout=to_seconds(dump_timeout, "dump_timeout"),
            verify_timeout=to_seconds(verify_timeout, "verify_timeout"),
            group_window=to_seconds(group_window, "group_window", allow_zero=True),
            victim_hold=to_seconds(victim_hold, "victim_hold", allow_zero=True),
        )
        self.resolution = to_seconds(resolution, "resolution")
        self.path = os.path.abspath(path or _directory.default_path())
        self.socket_path = os.path.join(self.path, SOCKET_NAME)
        self.events_path = events
        self.on_expire = on_expire
        self.use_pidfd = use_pidfd
        self._uid = os.geteuid()
        self._registry: Registry | None = None
        self._refused: dict[tuple[int, int], tuple[int, int]] = {}  # tables the scan refused, by file id
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._handshakes: Handshakes | None = None
        self._wake_r = self._wake_w = -1
        self._sink: EventSink | None = None
        self._enforcer = Enforcer(
            path=self.path, ladder=self.ladder, emit=self._emit, on_expire=on_expire, wake=self._wake
        )
        self._next_scan = 0.0
        self._last_loop_error = -_LOOP_ERROR_LOG_INTERVAL
        self._made: tuple[int, int] | None = None  # the directory's id when start() created it

    # ----------------------------------------------------------------- public
    def env(self) -> dict[str, str]:
        """The environment a worker needs to find this server: ``{"DISTINIT_WATCHDOG": path}``."""
        return {ENV_VAR: self.path}

    @property
    def running(self) -> bool:
        """Whether the server thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def worker_pids(self) -> list[int]:
        """The pids of the workers currently watched."""
        return [] if self._registry is None else self._registry.pids()

    def start(self) -> WatchdogServer:
        """Create the directory and socket, adopt existing slot tables, and start watching.

        Raises:
            WatchdogError: the directory is not private to this user (another user created it, or its
                mode lets others in), the socket path is too long, the events file is refused, or another
                server already serves ``path``.
        """
        if self.running:
            return self
        self._check_directory()
        try:
            self._sink = EventSink(self.events_path)
            try:
                self._listener = bind_listener(self.socket_path, self.path)
            except BaseException:
                self._sink.close()
                raise
        except BaseException:
            _directory.remove_if_made(self.path, self._made)
            raise
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
        self._registry = Registry(path=self.path, sel=self._sel, use_pidfd=self.use_pidfd, emit=self._emit)
        self._handshakes = Handshakes(
            self._listener, self._sel, vet_peer=self._vet_peer, on_hello=self._on_hello, on_refused=self._on_refused
        )
        self._stopping.clear()
        pidfd = "on" if self.use_pidfd and _proc.pidfd_supported() else "off"
        detail = (
            f"grace {self.ladder.grace} s, resolution {self.resolution} s, pidfd {pidfd}, "
            f"group window {self.ladder.group_window} s, victim hold {self.ladder.victim_hold} s"
        )
        self._emit(WatchdogEvent(event="watchdog.started", path=self.path, detail=detail))
        self._guarded(self._scan)  # resume deadlines armed before a restart right away
        self._next_scan = time.monotonic() + _scan.SCAN_INTERVAL
        self._thread = threading.Thread(target=self._loop, name="distinit-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | timedelta = 5.0) -> None:
        """Stop watching; armed tables stay for a later server. Idempotent, bounded by ``timeout``.

        The directory is removed when ``start()`` created it and it is left empty (no table, no stack file);
        a directory that existed before is never removed.
        """
        seconds = wait_bound(to_seconds(timeout, "timeout", allow_zero=True, allow_inf=True))
        if self._thread is None:
            return
        self._stopping.set()
        self._wake()
        self._thread.join(seconds)
        self._enforcer.join(min(seconds, 1.0))
        self._thread = None
        if self._registry is not None:
            self._registry.close_all()
        self._close_resources()
        self._emit(WatchdogEvent(event="watchdog.stopped", path=self.path))
        if self._sink is not None:
            self._sink.close()
        _directory.remove_if_made(self.path, self._made)  # only the one start() created, and only if empty
        self._made = None

    def __enter__(self) -> WatchdogServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- set-up and teardown
    def _check_directory(self) -> None:
        if len(self.socket_path.encode()) > MAX_SOCKET_PATH:
            raise WatchdogError(
                f"the socket path {self.socket_path!r} is {len(self.socket_path.encode())} bytes; "
                f"Unix sockets allow {MAX_SOCKET_PATH}",
                fix="choose a shorter --path, e.g. under /dev/shm or /tmp",
            )
        self._made = _directory.require_servable(self.path)

    def _close_resources(self) -> None:
        if self._handshakes is not None:
            self._handshakes.close()
        if self._sel is not None:
            self._sel.close()
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _emit(self, ev: WatchdogEvent) -> None:
        if self._sink is not None:
            self._sink.emit(ev)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._wake_r, 4096)

    # ----------------------------------------------------------------- loop
    def _loop(self) -> None:
        timeout = 0.0
        while not self._stopping.is_set():
            next_timeout = self._guarded(self._tick, timeout)
            timeout = self.resolution if next_timeout is None else next_timeout

    def _guarded(self, step: Callable[..., float | None], *args: float) -> float | None:
        """Run one step of the loop; an unexpected error is logged (rate-limited), never fatal."""
        try:
            return step(*args)
        except Exception:
            now = time.monotonic()
            if now - self._last_loop_error >= _LOOP_ERROR_LOG_INTERVAL:
                self._last_loop_error = now
                logger.exception(
                    "watchdog: a server step failed; the server keeps watching",
                    extra={"distinit": {"event": "watchdog.loop_failed", "path": self.path}},
                )
            return None

    def _tick(self, timeout: float) -> float:
        """One wake-up: dispatch ready descriptors, collect ladders, scan, check deadlines; the next sleep."""
        assert self._sel is not None
        assert self._handshakes is not None
        for key, _ in self._sel.select(timeout):
            self._guarded(key.data)
        assert self._registry is not None
        for wkey, result in self._enforcer.finished():
            self._registry.ladder_done(wkey, result)
        now = time.monotonic()
        self._handshakes.expire(now)
        if now >= self._next_scan:
            self._guarded(self._scan)
            self._next_scan = now + _scan.SCAN_INTERVAL
        nearest = self._enforcer.check(self._registry.snapshot(), now, self._registry.damaged)
        return max(0.0, min(self.resolution, nearest - time.monotonic(), self._next_scan - now))

    # ----------------------------------------------------------------- registration
    def _vet_peer(self, pid: int, uid: int) -> str | None:
        if uid != self._uid:
            return f"peer uid {uid} is not the server's uid {self._uid}; only the same user may register"
        if _proc.is_protected(pid):
            return f"pid {pid} is this server's own process or its parent; it would never be killed"
        return None

    def _on_refused(self, pid: int, uid: int, why: str) -> None:
        self._emit(WatchdogEvent(event="watchdog.rejected", path=self.path, pid=pid, uid=uid, detail=why))

    def _on_hello(self, conn: socket.socket, pid: int, uid: int, identity: Identity) -> str | None:
        start = _proc.start_time(pid)
        if start is None:
            return f"pid {pid} has exited"
        registry = self._registry
        assert registry is not None
        stale = registry.get((pid, start))
        if stale is not None and stale.busy:
            return f"pid {pid} is being killed: its region expired"
        if stale is not None:  # the process closed its client and created a new one: read the new table
            registry.forget(stale, unlink=False)
        w = registry.watch(pid, start, uid, adopting=False)
        if isinstance(w, str):
            return w
        try:
            conn.send(encode_reply(ok=True, stack=w.stack_path, server_pid=os.getpid()))
        except OSError as exc:
            registry.forget(w, unlink=False)
            return f"handshake failed: {exc.strerror or exc}"
        w.identity = identity
        w.mismatch = identity.disagreement(pid, Identity.from_proc(pid))
        registry.attach(w, conn)
        self._emit_about(w, "watchdog.registered", w.mismatch)
        return None

    def _emit_about(self, w: Worker, event: EventName, detail: str = "") -> None:
        """An event about watched worker ``w``: who it is (pid, start, uid, ranks) and ``detail``."""
        self._emit(WatchdogEvent(event=event, path=self.path, detail=detail, **w.facts()))

    # ----------------------------------------------------------------- scan
    def _scan(self) -> None:
        """Adopt slot tables of live workers not yet watched; clean up tables of dead ones."""
        assert self._registry is not None
        found = _scan.unwatched_tables(self.path, uid=self._uid, watched=self._registry)
        ids = {(pid, start): fid for pid, start, fid in found}
        self._refused = {key: fid for key, fid in self._refused.items() if ids.get(key) == fid}
        for pid, start, fid in found:
            if self._refused.get((pid, start)) != fid and not _proc.is_protected(pid):
                self._guarded(functools.partial(self._adopt, pid, start, fid))
        self._registry.reap_exited()

    def _adopt(self, pid: int, start: int, fid: tuple[int, int]) -> None:
        assert self._registry is not None
        w = self._registry.watch(pid, start, self._uid, adopting=True)
        if isinstance(w, str):
            self._refused[(pid, start)] = fid  # not re-examined until the file changes
            logger.debug("watchdog: not adopting the table of pid %d: %s", pid, w)
            return
        if w.table.closed:
            self._registry.forget(w)
            return
        w.identity = w.table.identity  # no hello: the ranks the client recorded in its table
        w.mismatch = w.identity.disagreement(pid, Identity.from_proc(pid))
        self._emit_about(w, "watchdog.adopted", f"{len(w.table.armed())} timer(s) armed")
