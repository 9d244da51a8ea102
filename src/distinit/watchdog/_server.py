"""The watchdog server: registers workers by kernel identity, reads their slot tables, kills."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from distinit.errors import WatchdogError
from distinit.watchdog import _proc, _slots
from distinit.watchdog._client import ENV_VAR, HELLO, SOCKET_NAME, default_path, private_dir_problem
from distinit.watchdog._events import EventSink, WatchdogEvent
from distinit.watchdog._ladder import LadderConfig, LadderResult, run_ladder

logger = logging.getLogger("distinit.watchdog")

SCAN_INTERVAL = 0.5
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the NUL


@dataclass
class _Worker:
    """One verified worker process and its slot table."""

    ref: _proc.ProcessRef
    table: _slots.TableReader
    uid: int
    stack_path: str
    sock: socket.socket | None = None
    busy: bool = False  # a kill ladder is running
    unkillable: bool = False
    exited: bool = False
    key: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (self.ref.pid, self.ref.start)


class WatchdogServer:
    """Kills exactly the worker whose armed region overran its deadline, after dumping its stack.

    Workers (:class:`~distinit.watchdog.WatchdogClient`) register over a Unix socket in the private
    directory ``path`` (mode 0700, socket 0600). The server takes each peer's pid and uid from the kernel
    (``SO_PEERCRED``), holds a pidfd on it (or its pid and procfs start time, re-checked before every
    signal), and maps the worker's slot table read-only. It only ever signals registered, verified, live
    processes of its own user, and never its own process or its parent.

    One thread sleeps until the nearest deadline, at most ``resolution`` seconds (20 ms by default), reads
    the tables and, for an expired region, runs the ladder in its own thread: stack dump (faulthandler in
    the worker, written to ``<path>/<pid>.<start>.stack``) → SIGCONT → SIGTERM → ``grace`` → SIGKILL →
    verify death, or report the worker unkillable (D-state). Each outcome is an event (logger
    ``distinit.watchdog``, optional JSONL file ``events``) passed to ``on_expire``.

    Slot tables outlive the server: a server restarted on the same path adopts every live worker's table
    and enforces deadlines armed before the restart. Linux only.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        grace: float = 5.0,
        dump_stacks: bool = True,
        on_expire: Callable[[WatchdogEvent], None] | None = None,
        events: str | None = None,
        kill_group: bool = False,
        resolution: float = 0.02,
        dump_timeout: float = 0.5,
        verify_timeout: float = 5.0,
        use_pidfd: bool = True,
    ) -> None:
        """Configure a server for ``path`` (``$DISTINIT_WATCHDOG`` or a per-user default when None).

        Raises:
            ValueError: a negative ``grace`` or a non-positive ``resolution``/timeouts.
        """
        if not math.isfinite(grace) or grace < 0:
            raise ValueError(f"grace must be finite seconds >= 0, got {grace!r}")
        for name, value in (
            ("resolution", resolution),
            ("dump_timeout", dump_timeout),
            ("verify_timeout", verify_timeout),
        ):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite seconds > 0, got {value!r}")
        self.path = os.path.abspath(path or default_path())
        self.socket_path = os.path.join(self.path, SOCKET_NAME)
        self.events_path = events
        self.on_expire = on_expire
        self.resolution = resolution
        self.use_pidfd = use_pidfd
        self.ladder = LadderConfig(
            grace=grace,
            dump_stacks=dump_stacks,
            kill_group=kill_group,
            dump_timeout=dump_timeout,
            verify_timeout=verify_timeout,
        )
        self._uid = os.geteuid()
        self._workers: dict[tuple[int, int], _Worker] = {}
        self._done: queue.SimpleQueue[tuple[tuple[int, int], LadderResult]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ladders: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r = self._wake_w = -1
        self._sink: EventSink | None = None
        self._lock = threading.Lock()

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
        with self._lock:
            return sorted(w.ref.pid for w in self._workers.values())

    def start(self) -> WatchdogServer:
        """Create the directory and socket, adopt existing slot tables, and start watching.

        Raises:
            WatchdogError: the directory is not private to this user, the socket path is too long, or
                another server already serves ``path``.
        """
        if self.running:
            return self
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise WatchdogError(
                f"cannot create the watchdog directory {self.path!r}: {exc}",
                fix="pass a path in a writable directory (WatchdogServer(path=...) or --path)",
            ) from exc
        problem = private_dir_problem(self.path)
        if problem is not None:
            raise WatchdogError(
                f"refusing to serve: {problem}",
                why="another user could plant slot tables or reach the socket, and make the server kill",
                fix=f"chmod 700 {self.path} (and make it yours), or choose another --path",
            )
        if len(self.socket_path.encode()) > MAX_SOCKET_PATH:
            raise WatchdogError(
                f"the socket path {self.socket_path!r} is {len(self.socket_path.encode())} bytes; "
                f"Unix sockets allow {MAX_SOCKET_PATH}",
                fix="choose a shorter --path, e.g. under /dev/shm or /tmp",
            )
        self._listener = self._bind()
        self._sink = EventSink(self.events_path)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stopping.clear()
        self._emit(
            WatchdogEvent(
                event="watchdog.started",
                path=self.path,
                detail=f"grace {self.ladder.grace} s, resolution {self.resolution} s, "
                f"pidfd {'on' if self.use_pidfd and _proc.pidfd_supported() else 'off'}",
            )
        )
        self._scan()  # resume deadlines armed before a restart right away
        self._thread = threading.Thread(target=self._loop, name="distinit-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching; armed tables stay for a later server. Idempotent, bounded by ``timeout``."""
        if self._thread is None:
            return
        self._stopping.set()
        self._wake()
        self._thread.join(timeout)
        for t in self._ladders:
            t.join(max(0.0, min(timeout, 1.0)))
        self._thread = None
        with self._lock:
            for w in list(self._workers.values()):
                if not w.busy:
                    self._release(w, unlink=False)
            self._workers.clear()
        if self._sel is not None:
            self._sel.close()
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._emit(WatchdogEvent(event="watchdog.stopped", path=self.path))
        if self._sink is not None:
            self._sink.close()

    def __enter__(self) -> WatchdogServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- set-up
    def _bind(self) -> socket.socket:
        if os.path.exists(self.socket_path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(self.socket_path)
            except OSError:
                os.unlink(self.socket_path)  # stale: its server died
            else:
                raise WatchdogError(
                    f"another watchdog server already serves {self.path!r}",
                    why="two servers on one path would each watch half the workers",
                    fix="stop the other server, or give this one its own --path (and DISTINIT_WATCHDOG)",
                )
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
        return sock

    def _emit(self, ev: WatchdogEvent) -> None:
        if self._sink is not None:
            self._sink.emit(ev)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # ----------------------------------------------------------------- loop
    def _loop(self) -> None:
        assert self._sel is not None
        next_scan = time.monotonic() + SCAN_INTERVAL
        timeout = 0.0
        while not self._stopping.is_set():
            for key, _ in self._sel.select(timeout):
                tag = key.data
                if tag == "listen":
                    self._accept()
                elif tag == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                else:
                    kind, wkey = tag
                    self._on_worker_fd(kind, wkey)
            while True:
                try:
                    wkey, result = self._done.get_nowait()
                except queue.Empty:
                    break
                self._ladder_done(wkey, result)
            now = time.monotonic()
            if now >= next_scan:
                self._scan()
                next_scan = now + SCAN_INTERVAL
            nearest = self._check_deadlines(now)
            timeout = max(0.0, min(self.resolution, nearest - time.monotonic(), next_scan - now))

    def _check_deadlines(self, now: float) -> float:
        nearest = math.inf
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            if w.busy or w.unkillable or w.exited or w.table.closed:
                continue
            expired: tuple[int, float] | None = None
            for slot, dl in w.table.armed():
                if dl <= now:
                    if expired is None or dl < expired[1]:
                        expired = (slot, dl)
                elif dl < nearest:
                    nearest = dl
            if expired is not None and w.table.deadline(expired[0]) == expired[1]:
                w.busy = True
                t = threading.Thread(
                    target=self._run_ladder,
                    args=(w, expired[0], now),
                    name=f"distinit-watchdog-kill-{w.ref.pid}",
                    daemon=True,
                )
                self._ladders = [x for x in self._ladders if x.is_alive()] + [t]
                t.start()
        return nearest

    def _run_ladder(self, w: _Worker, slot: int, detected: float) -> None:
        deadline, armed_at, scope, thread = w.table.slot_info(slot)
        stack_path = w.stack_path if os.path.exists(w.stack_path) else None
        try:
            result = run_ladder(w.ref, w.table.dump_signal, stack_path, self.ladder)
        except Exception as exc:  # never leave the worker marked busy (and unwatched) forever
            logger.exception(
                "watchdog: the kill ladder for pid %d failed",
                w.ref.pid,
                extra={"distinit": {"event": "watchdog.ladder_failed", "pid": w.ref.pid}},
            )
            alive = w.ref.alive()
            result = LadderResult(
                outcome="unkillable" if alive else "exited", detail=f"the kill ladder failed: {exc!r}"
            )
        ev = WatchdogEvent(
            event="watchdog.expired",
            path=self.path,
            pid=w.ref.pid,
            start_time=w.ref.start,
            uid=w.uid,
            scope=scope,
            thread=thread,
            after_s=round(deadline - armed_at, 6),
            deadline=deadline,
            overshoot_s=round(detected - deadline, 6),
            dead_after_s=None if result.dead_at is None else round(result.dead_at - deadline, 6),
            stack_file=stack_path if result.stack else None,
            stack=result.stack,
            signals=tuple(result.signals),
            outcome=result.outcome,
            detail=result.detail,
        )
        self._emit(ev)
        if self.on_expire is not None:
            try:
                self.on_expire(ev)
            except Exception:
                logger.exception(
                    "watchdog: on_expire callback raised for pid %d",
                    w.ref.pid,
                    extra={"distinit": {"event": "watchdog.callback_failed", "pid": w.ref.pid}},
                )
        self._done.put((w.key, result))
        self._wake()

    def _ladder_done(self, wkey: tuple[int, int], result: LadderResult) -> None:
        w = self._workers.get(wkey)
        if w is None:
            return
        w.busy = False
        if result.outcome == "unkillable":
            w.unkillable = True
        else:
            self._forget(w)

    # ----------------------------------------------------------------- registration
    def _accept(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.settimeout(0.5)
        pid, uid, _gid = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        try:
            error = self._register_peer(conn, pid, uid)
        except OSError as exc:
            error = f"handshake failed: {exc}"
        if error is not None:
            self._emit(WatchdogEvent(event="watchdog.rejected", path=self.path, pid=pid, uid=uid, detail=error))
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"ok": False, "error": error}).encode() + b"\n")
            conn.close()

    def _register_peer(self, conn: socket.socket, pid: int, uid: int) -> str | None:
        hello = b""
        while not hello.endswith(b"\n") and len(hello) < len(HELLO):
            chunk = conn.recv(len(HELLO) - len(hello))  # at most 6 bytes, 0.5 s: a slow peer cannot stall us
            if not chunk:
                break
            hello += chunk
        if uid != self._uid:
            return f"peer uid {uid} is not the server's uid {self._uid}; only the same user may register"
        if _proc.is_protected(pid):
            return f"pid {pid} is this server's own process or its parent; it would never be killed"
        if hello != HELLO:
            return f"bad hello {hello[:16]!r}"
        w = self._watch(pid, None, uid)
        if isinstance(w, str):
            return w
        conn.sendall(json.dumps({"ok": True, "stack": w.stack_path, "server_pid": os.getpid()}).encode() + b"\n")
        conn.setblocking(False)
        if w.sock is not None:
            self._drop_sock(w)
        w.sock = conn
        assert self._sel is not None
        self._sel.register(conn, selectors.EVENT_READ, ("sock", w.key))
        self._emit(WatchdogEvent(event="watchdog.registered", path=self.path, pid=pid, start_time=w.ref.start, uid=uid))
        return None

    def _watch(self, pid: int, expected_start: int | None, uid: int) -> _Worker | str:
        """Verify ``pid`` and map its table; the watched worker, or why not."""
        start = _proc.start_time(pid) if expected_start is None else expected_start
        if start is None:
            return f"pid {pid} has exited"
        existing = self._workers.get((pid, start))
        if existing is not None:
            return existing
        if _proc.owner_uid(pid) != uid:
            return f"pid {pid} is not owned by uid {uid}"
        ref = _proc.ProcessRef.open(pid, start, use_pidfd=self.use_pidfd)
        if ref is None:
            return f"pid {pid} (start time {start}) is gone or protected"
        table_path = os.path.join(self.path, _slots.slot_file_name(pid, start))
        try:
            table = _slots.TableReader(table_path, uid)
        except (OSError, ValueError) as exc:
            ref.close()
            return f"no valid slot table for pid {pid}: {exc}"
        if table.pid != pid or table.start != start:
            table.close()
            ref.close()
            return f"slot table {table_path!r} names pid {table.pid}/{table.start}, the kernel says {pid}/{start}"
        w = _Worker(
            ref=ref,
            table=table,
            uid=uid,
            stack_path=os.path.join(self.path, _slots.stack_file_name(pid, start)),
        )
        with self._lock:
            self._workers[w.key] = w
        if ref.pidfd is not None:
            assert self._sel is not None
            self._sel.register(ref.pidfd, selectors.EVENT_READ, ("pidfd", w.key))
        return w

    def _scan(self) -> None:
        """Adopt slot tables of live workers not yet watched; clean up tables of dead ones."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        for name in names:
            parsed = _slots.parse_file_name(name)
            if parsed is None or parsed in self._workers:
                continue
            pid, start = parsed
            file_path = os.path.join(self.path, name)
            if _proc.start_time(pid) != start or _proc.state(pid) == "Z":
                stack_path = os.path.join(self.path, _slots.stack_file_name(pid, start))
                with contextlib.suppress(OSError):
                    if os.lstat(file_path).st_uid == self._uid:
                        os.unlink(file_path)  # its process is gone
                with contextlib.suppress(OSError):
                    if os.lstat(stack_path).st_uid == self._uid and os.lstat(stack_path).st_size == 0:
                        os.unlink(stack_path)
                continue
            if _proc.is_protected(pid):
                continue
            w = self._watch(pid, start, self._uid)
            if isinstance(w, str):
                logger.debug("watchdog: not adopting %s: %s", name, w)
                continue
            if w.table.closed:
                self._forget(w)
                continue
            self._emit(
                WatchdogEvent(
                    event="watchdog.adopted",
                    path=self.path,
                    pid=pid,
                    start_time=start,
                    uid=self._uid,
                    detail=f"{len(w.table.armed())} timer(s) armed",
                )
            )
        for w in list(self._workers.values()):
            if w.ref.pidfd is None and not w.busy and not w.exited and not w.ref.alive():
                w.exited = True
                self._on_exit(w)

    # ----------------------------------------------------------------- departures
    def _on_worker_fd(self, kind: str, wkey: tuple[int, int]) -> None:
        w = self._workers.get(wkey)
        if w is None:
            return
        if kind == "sock":
            if w.sock is None:  # dropped earlier in this same batch of events
                return
            try:
                data = w.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if data:
                return  # clients send nothing after the hello; ignore stray bytes
            self._drop_sock(w)
            if w.table.closed and not w.busy:
                self._forget(w)
            return
        # pidfd readable: the process exited
        assert self._sel is not None
        assert w.ref.pidfd is not None
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(w.ref.pidfd)
        w.exited = True
        if not w.busy:
            self._on_exit(w)

    def _on_exit(self, w: _Worker) -> None:
        armed = [] if w.table.closed or w.unkillable else w.table.armed()
        if armed:
            slot, _ = min(armed, key=lambda a: a[1])
            deadline, armed_at, scope, thread = w.table.slot_info(slot)
            self._emit(
                WatchdogEvent(
                    event="watchdog.exited_armed",
                    path=self.path,
                    pid=w.ref.pid,
                    start_time=w.ref.start,
                    uid=w.uid,
                    scope=scope,
                    thread=thread,
                    after_s=round(deadline - armed_at, 6),
                    deadline=deadline,
                    detail=f"{len(armed)} region(s) armed; {max(0.0, deadline - time.monotonic()):.3f} s were left",
                )
            )
        self._forget(w)

    def _drop_sock(self, w: _Worker) -> None:
        if w.sock is not None:
            assert self._sel is not None
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(w.sock)
            w.sock.close()
            w.sock = None

    def _release(self, w: _Worker, *, unlink: bool) -> None:
        self._drop_sock(w)
        if w.ref.pidfd is not None and self._sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(w.ref.pidfd)
        w.ref.close()
        w.table.close()
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(w.table.path)
            with contextlib.suppress(OSError):
                if os.path.getsize(w.stack_path) == 0:
                    os.unlink(w.stack_path)

    def _forget(self, w: _Worker) -> None:
        with self._lock:
            self._workers.pop(w.key, None)
        self._release(w, unlink=True)
