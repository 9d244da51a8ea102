"""The watched workers: who they are, their connection and pidfd, and how each one leaves the table."""

from __future__ import annotations

import contextlib
import functools
import selectors
import socket
import threading
import time
from collections.abc import Callable

from distinit.watchdog._events import WatchdogEvent, region_event
from distinit.watchdog._ladder import LadderResult
from distinit.watchdog._worker import Worker, open_worker, release


class Registry:
    """The server's workers by (pid, start time), with the selector callbacks that notice departures.

    Used from the server thread; :meth:`pids` may be called from any thread.
    """

    def __init__(
        self, *, path: str, sel: selectors.BaseSelector, use_pidfd: bool, emit: Callable[[WatchdogEvent], None]
    ) -> None:
        """Workers of the directory ``path``; descriptors are watched through ``sel``, events go to ``emit``."""
        self.path = path
        self._sel = sel
        self._use_pidfd = use_pidfd
        self._emit = emit
        self._workers: dict[tuple[int, int], Worker] = {}
        self._lock = threading.Lock()  # guards _workers against pids() from other threads

    def __contains__(self, key: object) -> bool:
        return key in self._workers

    def get(self, key: tuple[int, int]) -> Worker | None:
        """The worker with this (pid, start time), if watched."""
        return self._workers.get(key)

    def snapshot(self) -> list[Worker]:
        """Every watched worker, now."""
        with self._lock:
            return list(self._workers.values())

    def pids(self) -> list[int]:
        """The watched workers' pids, sorted (not those a kill ladder ended, whose forgetting is pending)."""
        return sorted(w.ref.pid for w in self.snapshot() if not w.gone)

    def watch(self, pid: int, start: int, uid: int, *, adopting: bool) -> Worker | str:
        """Verify ``pid``, open its table and start watching it; the worker, or why not."""
        w = open_worker(self.path, pid, start, uid, use_pidfd=self._use_pidfd, adopting=adopting)
        if isinstance(w, str):
            return w
        with self._lock:
            self._workers[w.key] = w
        if w.ref.pidfd is not None:
            self._sel.register(w.ref.pidfd, selectors.EVENT_READ, functools.partial(self._pidfd_readable, w))
        return w

    def attach(self, w: Worker, conn: socket.socket) -> None:
        """Keep the worker's registration connection: its end-of-file says the client went away."""
        w.sock = conn
        self._sel.register(conn, selectors.EVENT_READ, functools.partial(self._client_readable, conn, w.key))

    def forget(self, w: Worker, *, unlink: bool = True) -> None:
        """Stop watching ``w`` and close its handles; ``unlink`` also removes its files."""
        with self._lock:
            if self._workers.get(w.key) is w:
                del self._workers[w.key]
        self._drop_sock(w)
        if w.ref.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(w.ref.pidfd)
        release(w, unlink=unlink)

    def close_all(self) -> None:
        """Forget every worker, leaving their tables for a later server (a running ladder keeps its own)."""
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            if not w.busy:
                self._drop_sock(w)
                release(w, unlink=False)

    def ladder_done(self, key: tuple[int, int], result: LadderResult | None) -> None:
        """A kill ladder ended: forget the worker, keep it marked unkillable, or (None: not killed) watch it again."""
        w = self._workers.get(key)
        if w is None:
            return
        w.busy = False
        if result is None:
            if w.exited:  # it exited while judged: what its pidfd callback skipped
                self._on_exit(w)
        elif result.outcome == "unkillable":
            w.unkillable = True
        else:
            self.forget(w)

    def damaged(self, w: Worker, exc: Exception) -> None:
        """The worker's table became unreadable (truncated, replaced): say so and stop watching it."""
        detail = f"stopped watching pid {w.ref.pid}: its slot table became unreadable: {exc}"
        self._emit(WatchdogEvent(event="watchdog.rejected", path=self.path, pid=w.ref.pid, uid=w.uid, detail=detail))
        self.forget(w, unlink=False)

    def reap_exited(self) -> None:
        """Notice workers without a pidfd that have exited (the scan calls this)."""
        for w in self.snapshot():
            if w.ref.pidfd is None and not w.busy and not w.exited and not w.ref.alive():
                w.exited = True
                self._on_exit(w)

    # ----------------------------------------------------------------- selector callbacks
    def _client_readable(self, conn: socket.socket, key: tuple[int, int]) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            return  # clients send nothing after the hello; ignore stray bytes
        w = self._workers.get(key)
        if w is None or w.sock is not conn:  # a connection of a client since replaced
            self._close_sock(conn)
            return
        self._drop_sock(w)
        with contextlib.suppress(OSError, ValueError):
            if w.table.closed and not w.busy:
                self.forget(w)

    def _pidfd_readable(self, w: Worker) -> None:
        if w.ref.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(w.ref.pidfd)
        w.exited = True
        if not w.busy and self._workers.get(w.key) is w:
            self._on_exit(w)

    def _on_exit(self, w: Worker) -> None:
        try:
            armed = [] if w.table.closed or w.unkillable else w.table.armed()
            info = w.table.slot_info(min(armed, key=lambda a: a[1])[0]) if armed else None
        except (OSError, ValueError):
            armed, info = [], None
        if info is not None:
            left = max(0.0, info[0] - time.monotonic())
            self._emit(
                region_event(
                    "watchdog.exited_armed",
                    path=self.path,
                    region=info,
                    **w.facts(),
                    detail=f"{len(armed)} region(s) armed; {left:.3f} s were left",
                )
            )
        self.forget(w)

    def _close_sock(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        conn.close()

    def _drop_sock(self, w: Worker) -> None:
        if w.sock is not None:
            self._close_sock(w.sock)
            w.sock = None
