"""The server side of the torch FileTimer drop-in: ``FileTimerServer``, over torch's FIFO protocol.

Same constructor, methods and request handling as ``torch.distributed.elastic.timer.FileTimerServer``
(``_timers`` keyed by (pid, scope), ``register_timers``, ``clear_timers``, ``get_expired_timers``,
``_reap_worker``, ``run_once``, ``start``/``stop``, ``log_event(name, request)``), so torch's clients and
torch's tests work unchanged. Where torch is wrong, it differs (docs/watchdog.md, "Migrating from torch's
FileTimer"):

* it never signals its own process, its parent, pid ≤ 1, a negative pid (a process group) or a process of
  another user; torch sends the worker's signal to its own process after every reap;
* it signals only a plausible worker of this job: a process that holds the FIFO open, that started with
  ``TORCHELASTIC_TIMER_FILE`` naming the FIFO (or ``TORCHELASTIC_RUN_ID`` equal to ``run_id``), or that
  descends from the server's process or ``worker_parent``; never an ancestor of the server. Others are
  refused (decided once per process, at its first acquire); torch signals any pid a line names;
* at most MAX_TIMERS_PER_PID timers per process (torch: no limit), so a flood naming one pid cannot crowd
  out the others' timers; a dropped acquire is a ``watchdog.rejected`` event;
* its FIFO replaced by something else (a regular file torch's clients would write into, or nothing) is
  noticed within 0.1 s, reported once and recreated; a FIFO of another server is left to it;
* a worker is the pid *and* the start time seen when its timer was acquired (``"start"`` in the request
  when the client sends it, else read from procfs on arrival), signalled through a pidfd: a reused pid is
  never signalled (torch checks ``os.kill(pid, 0)``);
* a worker whose client installed the dump handler gets a stack dump before the signal (``dump_timeout``,
  0.1 s, bounds the time a dump makes no progress; a dump not taken says why in the event's detail), and the
  stack file of a reported dump is kept (the event names it);
* workers of one job whose timers expire together (within ``group_window``) are judged as the native server
  judges them (:mod:`~distinit.watchdog._culprit`): the one running its own code is signalled first, those
  waiting in a collective ``victim_hold`` seconds later if still armed, so a launcher names the culprit;
* every event names the worker's rank, from its request when the client sends one, else from the environment
  it started with (``/proc/<pid>/environ``: RANK, LOCAL_RANK, WORLD_SIZE or the Slurm/Open MPI ones);
* expiry is noticed at the deadline (the loop sleeps until the nearest deadline, at most ``max_interval``),
  not up to a whole ``max_interval`` late;
* the FIFO is created 0600, refused if a symlink, a directory or another user's file stands at the path, and
  every request is bounded and validated: a malformed, oversized or hostile line is logged and dropped and
  never stops the server.

Reads launcher variables itself: ``TORCHELASTIC_TIMER_FILE`` and ``TORCHELASTIC_RUN_ID`` in another process's
``/proc/<pid>/environ``, as torch's protocol defines them, are evidence that it is a worker of this job (torchrun
passes both to its workers); no world is resolved from them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import select
import signal as _signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from distinit.errors import WatchdogError
from distinit.watchdog import _dump
from distinit.watchdog._batch import gather, role_and_note, verdict_event
from distinit.watchdog._culprit import assess, judge
from distinit.watchdog._events import EventSink, Outcome, Role, WatchdogEvent
from distinit.watchdog._ladder import signal_name
from distinit.watchdog._proc import (
    ProcessRef,
    ancestors,
    holds_file,
    owner_uid,
    read_environ,
    start_time,
    state,
)
from distinit.watchdog._protocol import Identity
from distinit.watchdog._timer_client import (
    DUMP_SIGNAL,
    MAX_LINE_BYTES,
    FileTimerRequest,
    publish_marker,
    stack_path,
    withdraw_marker,
)

logger = logging.getLogger("distinit.watchdog")

#: The most timers held at once; acquires beyond it are dropped with a ``watchdog.rejected`` event.
MAX_TIMERS = 65536
#: The most timers (scopes) one process may hold at once: a flood naming one pid cannot crowd out the others.
MAX_TIMERS_PER_PID = 64
#: The most timers held for processes that will never be signalled (refused): kept only to report their expiry.
MAX_REFUSED_TIMERS = 1024
# The most watchdog.rejected events written per _WARN_EVERY seconds (the others are counted in the next one).
_REJECTED_EVENTS = 20
#: The longest scope id kept (longer ones are cut; lines are bounded by PIPE_BUF anyway).
MAX_SCOPE_CHARS = 1024
# The most bytes read from the FIFO in one pass, so a flooding writer cannot delay expiry checks.
_READ_BUDGET = 1 << 20
_WARN_EVERY = 5.0
_SWEEP_EVERY = 0.1
_SIGNAL_MAX = int(_signal.SIGRTMAX)
# How every request line of torch's and distinit's clients begins (json.dumps of a dict led by "version").
_LINE_START = b'{"version"'
# After a batch's last deadline, let the clock pass it before the timers are read again.
_SETTLE = 0.005

LogEvent = Callable[[str, FileTimerRequest | None], None]
#: A worker's stack dump: (its stack file, or None when no dump was asked; what it gave, or why not).
Dumped = tuple["str | None", _dump.Dump]


def parse_request(line: bytes) -> FileTimerRequest | str:
    """One request line → a request, or the reason it is refused (never raises).

    The line must be one JSON object with ``version`` 1, an integer ``pid``, a string ``scope_id``, a
    finite number ``expiration_time`` and an integer ``signal`` within ±SIGRTMAX. Optional keys a client may
    add (torch's server ignores them): ``start`` (the worker's start time), ``thread`` (the ident of the thread
    that acquired) and ``rank``, ``local_rank``, ``world_size``; kept on the request, malformed ones unknown.
    Scope ids are kept as ASCII: other characters are escaped with a backslash, control characters too.
    """
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return f"not JSON ({type(exc).__name__})"
    if not isinstance(doc, dict):
        return f"not a JSON object ({type(doc).__name__})"
    version, pid, scope, when, sig = (doc.get(k) for k in ("version", "pid", "scope_id", "expiration_time", "signal"))
    if version != 1 or type(version) is not int:
        return f"unsupported version {version!r}"
    if type(pid) is not int or abs(pid) > 1 << 22:
        return f"pid {pid!r} is not a pid"
    if not isinstance(scope, str):
        return f"scope_id {type(scope).__name__} is not a string"
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        return f"expiration_time {when!r} is not a finite number"
    if type(sig) is not int or abs(sig) > _SIGNAL_MAX:
        return f"signal {sig!r} is not a signal number"
    start, thread = doc.get("start"), doc.get("thread")
    request = _Request(pid, _ascii(scope), float(when), sig)
    request.start = start if type(start) is int and start >= 0 else None
    request.thread = thread if type(thread) is int and 0 < thread < 1 << 64 else None
    request.claimed = Identity.from_facts(doc)
    return request


class _Request(FileTimerRequest):
    """A request read from the FIFO, with what the client added: start time, thread, ranks (None: not sent)."""

    __slots__ = ("claimed", "start", "thread")

    def __init__(self, pid: int, scope_id: str, expiration_time: float, signal: int) -> None:
        super().__init__(pid, scope_id, expiration_time, signal)
        self.start: int | None = None
        self.thread: int | None = None
        self.claimed = Identity()


def _ascii(scope: str) -> str:
    """``scope`` as printable ASCII of at most MAX_SCOPE_CHARS; distinct scopes stay distinct.

    A longer one keeps its head and ends with ``#`` and a digest of the whole id: a cut alone would merge
    two long scopes of one worker into one timer (releasing one would disarm the other).
    """
    plain = scope.isascii() and scope.isprintable() and "\\" not in scope  # a backslash is escaped too: "é" ≠ r"\xe9"
    kept = scope if plain else scope.encode("unicode_escape").decode("ascii")
    if len(kept) <= MAX_SCOPE_CHARS:
        return kept
    digest = hashlib.blake2b(kept.encode("ascii"), digest_size=8).hexdigest()
    return f"{kept[: MAX_SCOPE_CHARS - len(digest) - 1]}#{digest}"


def caught_signals(pid: int) -> int:
    """The mask of signals ``pid`` has handlers for (``SigCgt`` in /proc/<pid>/status); 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def make_fifo(file_path: str, *, before_open: Callable[[os.stat_result], None] | None = None) -> tuple[int, int]:
    """Create the FIFO ``file_path`` (0600) and open it: (read end, keep-alive write end), both non-blocking.

    As torch's server does, a FIFO or regular file of this user already at the path is replaced. A symlink,
    a directory, another file type or another user's file is refused: removing it would follow a trap.
    ``before_open`` is called with the new FIFO's ``stat`` before it is opened for reading (clients can open
    it only from then on); the FIFO opened must be that one.

    Raises:
        WatchdogError: the path is refused or the FIFO cannot be created.
    """
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(file_path)
        problem = ""
        if stat.S_ISLNK(st.st_mode):
            problem = "is a symlink"
        elif not (stat.S_ISFIFO(st.st_mode) or stat.S_ISREG(st.st_mode)):
            problem = "is neither a FIFO nor a regular file"
        elif st.st_uid != os.geteuid():
            problem = f"belongs to uid {st.st_uid}, not to this server's uid {os.geteuid()}"
        if problem:
            raise WatchdogError(
                f"refusing the timer FIFO path {file_path!r}: it {problem}",
                why="FileTimerServer replaces what stands at its path; replacing this could follow a trap",
                fix="remove it yourself, or choose a path in a directory only you can write",
            )
        os.unlink(file_path)
    try:
        os.mkfifo(file_path, 0o600)
        made = os.lstat(file_path)
        if before_open is not None:
            before_open(made)
        rfd = os.open(file_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WatchdogError(
            f"cannot create the timer FIFO {file_path!r}: {exc.strerror or exc}",
            why="its directory is missing or not writable, or another process created the name first",
            fix="choose a path in an existing directory only you can write",
        ) from exc
    st = os.fstat(rfd)
    if (
        not stat.S_ISFIFO(st.st_mode)
        or st.st_uid != os.geteuid()
        or (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino)
    ):
        os.close(rfd)
        raise WatchdogError(
            f"the timer FIFO {file_path!r} was replaced while it was being opened",
            why="another process swapped the name between mkfifo and open",
            fix="choose a path in a directory only you can write",
        )
    # Holding a write end ourselves keeps the FIFO from reporting end-of-file (POLLHUP) between clients.
    wfd = os.open(file_path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    return rfd, wfd


class FileTimerServer:
    """Reap workers whose timers expired; reads torch's FIFO protocol (distinit's or torch's clients).

    Args:
        file_path: the FIFO to create (what stands there is replaced, unless refused: see :func:`make_fifo`).
        run_id: a name for this job, in log lines.
        max_interval: the longest sleep of the watchdog loop, seconds (one ``_run_watchdog`` call per
            interval, as torch's); expiries are noticed at their deadline, not at the next interval.
        daemon: whether the watchdog thread is a daemon thread.
        log_event: called as ``log_event(name, request)`` for "watchdog started", "timer expired",
            "kill worker process" and "watchdog stopped" (torch's names); an exception it raises is logged.
        dump_timeout: the longest a worker's stack dump may make no progress before its signal (time in which
            the worker only waits for a CPU does not count; 0 disables dumps).
        events: append each expiry as one ``WatchdogEvent`` JSON line to this file (as ``WatchdogServer``).
        group_window: when a worker's timer expires and other workers of its job (the same ``WORLD_SIZE``)
            have a deadline within this many seconds, wait for them and judge them together, culprit first
            (as ``WatchdogServer``; 0: every expired worker is signalled at once, as torch's server does).
        victim_hold: seconds between signalling the culprit and signalling the victims still armed.
        worker_parent: the pid of the workers' launcher: its descendants count as workers of this job. The
            descendants of the server's own process always do (torch's agent hosts its server); other
            workers must hold the FIFO open (distinit's client does) or have started with
            ``TORCHELASTIC_TIMER_FILE`` naming the FIFO (torchrun passes it on) or ``TORCHELASTIC_RUN_ID``
            equal to ``run_id``; any other pid a request names is refused, never signalled.

    Raises:
        ValueError: ``max_interval`` is not a finite number > 0, ``dump_timeout``, ``group_window`` or
            ``victim_hold`` not a finite number >= 0, or ``worker_parent`` not the pid of a live process.
        WatchdogError: the FIFO or the events file is refused.
    """

    def __init__(
        self,
        file_path: str,
        run_id: str,
        max_interval: float = 10,
        daemon: bool = True,
        log_event: LogEvent | None = None,
        *,
        dump_timeout: float = 0.1,
        events: str | None = None,
        group_window: float = 1.0,
        victim_hold: float = 2.0,
        worker_parent: int | None = None,
    ) -> None:
        if not (isinstance(max_interval, int | float) and math.isfinite(max_interval) and max_interval > 0):
            raise ValueError(f"max_interval must be a finite number of seconds > 0, got {max_interval!r}")
        for name, value in (
            ("dump_timeout", dump_timeout),
            ("group_window", group_window),
            ("victim_hold", victim_hold),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        self._roots = [(os.getpid(), start_time(os.getpid()))]  # whose descendants are workers (pid, start)
        if worker_parent is not None:
            parent_start = start_time(worker_parent) if type(worker_parent) is int and worker_parent > 0 else None
            if parent_start is None:
                raise ValueError(f"worker_parent must be the pid of a live process, got {worker_parent!r}")
            self._roots.append((worker_parent, parent_start))
        self._file_path = file_path
        self._run_id = run_id
        self._max_interval = float(max_interval)
        self._daemon = daemon
        self._dump_timeout = float(dump_timeout)
        self._group_window = float(group_window)
        self._victim_hold = float(victim_hold)
        self._log_event: LogEvent = log_event if log_event is not None else (lambda name, request: None)
        self._timers: dict[tuple[int, str], FileTimerRequest] = {}
        self._procs: dict[int, ProcessRef | None] = {}  # identity seen at acquire; None: never signalled
        self._who: dict[int, tuple[Identity, str]] = {}  # pid -> its ranks, and how its claim contradicts its env
        self._armed: dict[tuple[int, str], tuple[float, int | None]] = {}  # timer -> (read at, monotonic; thread)
        self._batches: list[_Batch] = []  # workers of one job being judged together
        self._request_count = 0
        self._stop_signaled = False
        self._run_once = False
        self._watchdog_thread: threading.Thread | None = None
        self._is_client_started = False
        self._last_progress_time = int(time.time())
        self._pending = b""
        self._skipping = False
        self._warned_at: dict[str, float] = {}
        self._dropped: dict[str, int] = {}
        self._tick_end = 0.0
        self._swept_at = 0.0
        self._facts: dict[int, _Facts] = {}  # what this pass reports of the workers it reaps, by pid
        self._signalled: dict[int, bool] = {}  # pids _reap_worker signalled in this pass
        self._refused: dict[int, tuple[int | None, str]] = {}  # pid -> (its start time, why it is not signalled)
        self._per_pid: dict[int, int] = {}  # pid -> how many timers it holds
        self._refused_timers = 0  # timers held by refused pids
        self._capped: set[int] = set()  # pids whose dropped acquire was reported (once until one is released)
        self._events_window = (-math.inf, 0, 0)  # watchdog.rejected events: (window start, sent, suppressed)
        self._fd_lock = threading.Lock()  # the FIFO's fds are swapped when it is recreated; _wake writes to one
        self._fifo_checked_at = 0.0
        self._path_seen: tuple[int, int] | None = None  # what stood at the path when last reported (0, 0: nothing)
        self._sink = EventSink(events)
        self._marker = -1  # the marker that tells distinit's clients this server reads the FIFO (held open)
        try:
            self._rfd, self._wfd = make_fifo(file_path, before_open=self._publish)
            st = os.fstat(self._rfd)
            self._fifo_id = (st.st_dev, st.st_ino)  # stop() removes this FIFO only, not a successor's
            self._fifos = {self._fifo_id}  # every FIFO this server made: a worker holds one of them open
        except BaseException:
            if self._marker >= 0:
                withdraw_marker(file_path, self._marker)
            self._sink.close()
            raise
        self._poller = select.poll()
        self._poller.register(self._rfd, select.POLLIN)

    # -- lifecycle (torch's) --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog thread."""
        self._stop_signaled = False
        self._tick_end = time.monotonic()
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop, name="distinit-file-timer", daemon=self._daemon
        )
        self._watchdog_thread.start()
        self._emit("watchdog started", None)

    def stop(self) -> None:
        """Stop the thread (waits at most ``max_interval`` + 1 s), remove the FIFO and close everything."""
        self._stop_signaled = True
        self._end_thread(self._max_interval + 1.0)
        self._close()
        self._emit("watchdog stopped", None)

    def run_once(self) -> None:
        """Let the thread finish one more pass, reading every request already written, then stop it."""
        self._run_once = True
        if not self._end_thread(self._max_interval + 5.0):
            self._run_watchdog()
        self._close()

    def _end_thread(self, timeout: float) -> bool:
        """Wake the loop and wait for its thread to end (at most ``timeout``); False when none was running."""
        self._wake()
        thread, self._watchdog_thread = self._watchdog_thread, None
        if thread is None:
            return False
        thread.join(timeout)
        return True

    def get_last_progress_time(self) -> int:
        """When the loop last completed a pass (epoch seconds; now, before any client connected)."""
        return self._last_progress_time if self._is_client_started else int(time.time())

    def _wake(self) -> None:
        """End the loop's sleep now: an empty line through our own FIFO (skipped by the reader)."""
        with self._fd_lock, contextlib.suppress(OSError):
            if self._wfd >= 0:
                os.write(self._wfd, b"\n")

    def _publish(self, fifo: os.stat_result) -> None:
        """Publish the marker for the new FIFO; without one, distinit's clients act as torch's (no dumps)."""
        try:
            self._marker = publish_marker(self._file_path, fifo)
        except OSError as exc:
            logger.warning(
                "watchdog: cannot publish the marker beside the timer FIFO %r (%s): distinit's clients will treat "
                "this server as torch's (a request per open, no stack dumps)",
                self._file_path,
                exc.strerror or exc,
                extra={"distinit": {"event": "watchdog.no_marker", "path": self._file_path}},
            )

    def _close(self) -> None:
        with self._fd_lock:
            for fd in (self._rfd, self._wfd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._rfd = self._wfd = -1
        if self._marker >= 0:
            withdraw_marker(self._file_path, self._marker)
            self._marker = -1
        with contextlib.suppress(OSError):
            st = os.lstat(self._file_path)
            if stat.S_ISFIFO(st.st_mode) and (st.st_dev, st.st_ino) == self._fifo_id:
                os.unlink(self._file_path)  # a second server on this path made its own FIFO: leave that one
        for ref in self._procs.values():
            if ref is not None:
                ref.close()
        self._procs.clear()
        self._who.clear()
        self._refused.clear()
        self._batches.clear()  # workers still being judged are left alone
        self._sink.close()

    # -- the loop ---------------------------------------------------------------------------------------------

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """Whether ``pid`` names a live process (never a process group: negative pids are not running)."""
        return pid > 0 and state(pid) not in (None, "Z", "X")

    def _watchdog_loop(self) -> None:
        self._is_client_started = True
        while not self._stop_signaled:
            run_once = self._run_once
            try:
                self._run_watchdog()
            except Exception:
                self._warn("loop", "watchdog: the FileTimer loop failed; it goes on", exc_info=True)
            if run_once:
                break
            self._last_progress_time = int(time.time())

    def _run_watchdog(self) -> None:
        """One interval: read requests, reap expired workers, sleep until the next deadline or the interval end.

        Interval ends follow a fixed schedule (start + k·max_interval), so the number of calls matches the
        elapsed time however late the thread is woken; expiries are handled inside the interval, at once.
        """
        interval = self._max_interval
        now = time.monotonic()
        self._tick_end = max(self._tick_end + interval, now - 10 * interval)
        while True:
            self._check_fifo()
            self.register_timers(self._read_requests())
            self._reap_expired()
            if self._run_once or self._stop_signaled:
                return
            now = time.monotonic()
            left = self._tick_end - now
            if left <= 0:
                return
            held = self._held()
            nearest = min((r.expiration_time for (p, _), r in self._timers.items() if p not in held), default=math.inf)
            wait = max(0.0, min(left, nearest - time.time(), self._next_step()))
            with contextlib.suppress(InterruptedError):
                self._poller.poll(math.ceil(wait * 1000))

    def _read_requests(self) -> list[FileTimerRequest]:
        """Every complete line the FIFO holds now (at most 1 MiB per pass), parsed; bad lines are logged."""
        requests: list[FileTimerRequest] = []
        budget = _READ_BUDGET
        while budget > 0 and self._rfd >= 0:
            try:
                chunk = os.read(self._rfd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                self._warn("read", f"watchdog: reading the timer FIFO {self._file_path!r} failed: {exc}")
                break
            if not chunk:
                break
            budget -= len(chunk)
            self._split(chunk, requests)
        return requests

    def _split(self, chunk: bytes, requests: list[FileTimerRequest]) -> None:
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            skipping, self._skipping = self._skipping, False
            resync = line.rfind(_LINE_START)
            if resync > 0 or (skipping and resync == 0):
                # A writer left half a line (it died, or holds the FIFO open and writes no newline): the next
                # client's whole line was appended to it. Every client's line starts with _LINE_START, and a
                # client writes its line at once (≤ PIPE_BUF: atomic), so its line is the tail from there.
                self._reject(f"{resync} bytes of an unfinished line before a request")
                line = line[resync:]
            elif skipping:  # the rest of an oversized line
                continue
            if len(line) > MAX_LINE_BYTES:  # torch's client sends up to PIPE_BUF bytes before the newline
                self._reject(f"a line of {len(line)} bytes (limit {MAX_LINE_BYTES})")
                continue
            if not line.strip():
                continue
            parsed = parse_request(line)
            if isinstance(parsed, str):
                self._reject(parsed)
            else:
                requests.append(parsed)
        if len(self._pending) > MAX_LINE_BYTES:
            self._reject(f"a line of more than {MAX_LINE_BYTES} bytes")
            self._pending, self._skipping = b"", True

    def register_timers(self, timer_requests: list[FileTimerRequest]) -> None:
        """Apply requests: an acquire sets the (pid, scope) timer (replacing one of that scope), a release drops it.

        An acquire beyond MAX_TIMERS_PER_PID timers of its pid, MAX_REFUSED_TIMERS of refused pids or
        MAX_TIMERS in all is dropped, with a ``watchdog.rejected`` event naming the pid (once until it
        releases one). Per request: dict updates, and one procfs read to confirm an identified process.
        """
        now = time.monotonic()
        for request in timer_requests:
            ours = request if isinstance(request, _Request) else None
            self._request_count += 1
            pid = request.worker_pid
            key = (pid, request.scope_id)
            if request.expiration_time < 0:
                self._drop_timer(key)
                continue
            self._identify(pid, None if ours is None else ours.start, ours)
            if key not in self._timers:
                full = self._over_cap(pid)
                if full:
                    self._reject(full)
                    if pid not in self._capped:
                        if len(self._capped) >= MAX_TIMERS:
                            self._capped.clear()
                        self._capped.add(pid)
                        fix = "release timers (a scope per region, released when it ends), or find who floods the FIFO"
                        self._rejected(pid, request.scope_id, f"acquire dropped: {full}. fix: {fix}", None)
                    continue
                self._per_pid[pid] = self._per_pid.get(pid, 0) + 1
                self._refused_timers += pid in self._refused
            self._timers[key] = request
            self._armed[key] = (now, None if ours is None else ours.thread)

    def _over_cap(self, pid: int) -> str:
        """Why a new timer of ``pid`` is not held (a cap is reached), or ``""``."""
        held = self._per_pid.get(pid, 0)
        if held >= MAX_TIMERS_PER_PID:
            return f"pid {pid} holds {held} timers already, the most one process may hold ({MAX_TIMERS_PER_PID})"
        if pid in self._refused and self._refused_timers >= MAX_REFUSED_TIMERS:
            return (
                f"pid {pid} is never signalled and {self._refused_timers} timers of such pids are held already "
                f"(at most {MAX_REFUSED_TIMERS})"
            )
        if len(self._timers) >= MAX_TIMERS:
            return f"more than {MAX_TIMERS} timers at once (pid {pid})"
        return ""

    def _drop_timer(self, key: tuple[int, str]) -> None:
        """Forget one timer (and its count)."""
        self._armed.pop(key, None)
        if self._timers.pop(key, None) is None:
            return
        pid = key[0]
        left = self._per_pid.get(pid, 1) - 1
        if left > 0:
            self._per_pid[pid] = left
        else:
            self._per_pid.pop(pid, None)
        self._refused_timers -= pid in self._refused
        self._capped.discard(pid)

    def _set_refused(self, pid: int, refusal: tuple[int | None, str] | None) -> None:
        """Record why ``pid`` is never signalled (None: it may be), keeping the count of refused timers."""
        was = pid in self._refused
        if refusal is None:
            self._refused.pop(pid, None)
        else:
            self._refused[pid] = refusal
        if was != (refusal is not None):
            self._refused_timers += self._per_pid.get(pid, 0) * (1 if refusal is not None else -1)

    def _identify(self, pid: int, start: int | None, request: _Request | None) -> None:
        """Remember which process ``pid`` is now (pidfd + start time; None: never signalled) and its ranks.

        The ranks are the ones the request claims, else the ones in the environment the process started
        with (``/proc/<pid>/environ``); a claim that environment contradicts is noted (``Identity.disagreement``).
        """
        ref = self._procs.get(pid)
        claimed = Identity() if request is None else request.claimed
        if ref is not None and (start is None or ref.start == start) and _running(ref):
            if claimed != Identity() and self._who[pid][0] != claimed:
                self._who[pid] = (claimed, claimed.disagreement(pid, Identity.from_proc(pid)))
            return
        refused = self._refused.get(pid)
        if ref is None and refused is not None and pid in self._procs:  # refused already: the same process?
            now_start = start_time(pid) if pid > 0 else None
            if now_start == refused[0] and (start is None or start == now_start):
                return
        if ref is not None:
            ref.close()
        new = ProcessRef.open(pid, start) if pid > 0 and owner_uid(pid) == os.geteuid() else None
        why = (
            f"pid {pid} is not signalled: when its timer was acquired it was not a live process of uid "
            f"{os.geteuid()} that this server may signal (its own process, its parent, pid <= 1, a thread id or "
            "a process group are never signalled)"
        )
        if new is not None:
            why = self._not_a_worker(pid)
            if why:
                new.close()
                new = None
        self._procs[pid] = new
        self._set_refused(pid, None if new is not None else (start_time(pid) if pid > 0 else None, why))
        if new is None:  # never signalled: neither its environment nor a claim (any line can name it) is read
            self._who[pid] = (Identity(), "")
            scope = None if request is None else request.scope_id
            self._rejected(pid, scope, why, "refused")
        else:
            environ = Identity.from_proc(pid)
            self._who[pid] = (
                (claimed, claimed.disagreement(pid, environ)) if claimed != Identity() else (environ or Identity(), "")
            )

    def _not_a_worker(self, pid: int) -> str:
        """Why ``pid`` (a live process of this user, pinned by a pidfd) is not signalled, or ``""`` for a worker.

        A worker of this job: a descendant of the server's process or of ``worker_parent``, a process that
        started with ``TORCHELASTIC_TIMER_FILE`` naming this FIFO or ``TORCHELASTIC_RUN_ID`` equal to the
        run id, or one holding this FIFO open; never an ancestor of the server. Tried cheapest first, once per
        process: the two ppid chains (one procfs read per level), its environ (one read), its fds (a
        ``stat`` each).
        """
        me = os.getpid()
        if pid in ancestors(me):
            return (
                f"pid {pid} was not signalled: it is an ancestor of this server (pid {me}), e.g. the shell or "
                "launcher that started it, never one of its workers"
            )
        above = ancestors(pid)
        if any(root in above and start_time(root) == root_start for root, root_start in self._roots):
            return ""
        environ = read_environ(pid) or {}
        if self._names_fifo(pid, environ.get("TORCHELASTIC_TIMER_FILE", "")):
            return ""
        if self._run_id and environ.get("TORCHELASTIC_RUN_ID") == self._run_id:
            return ""
        if holds_file(pid, self._fifos):
            return ""
        parents = " or ".join(str(root) for root, _ in self._roots)
        return (
            f"pid {pid} was not signalled: it is not a worker of this job (it does not hold the FIFO "
            f"{self._file_path!r} open, did not start with TORCHELASTIC_TIMER_FILE={self._file_path!r} or "
            f"TORCHELASTIC_RUN_ID={self._run_id!r}, and does not descend from pid {parents}); "
            "fix: if it is a worker, launch it with TORCHELASTIC_TIMER_FILE set to the FIFO (torchrun passes it "
            "on) or serve with --workers-of <its launcher's pid> (FileTimerServer(worker_parent=...)); "
            "otherwise find the process that writes lines naming it"
        )

    def _names_fifo(self, pid: int, value: str) -> bool:
        """Whether ``value`` (``pid``'s TORCHELASTIC_TIMER_FILE, relative to its cwd) names this server's FIFO."""
        if not value:
            return False
        if not os.path.isabs(value):
            try:
                value = os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)
            except OSError:
                return False
        if os.path.normpath(value) == os.path.normpath(os.path.abspath(self._file_path)):
            return True
        try:
            st = os.stat(value)
        except (OSError, ValueError):
            return False
        return stat.S_ISFIFO(st.st_mode) and (st.st_dev, st.st_ino) in self._fifos

    def _rejected(self, pid: int | None, scope: str | None, detail: str, outcome: Outcome | None) -> None:
        """Emit a ``watchdog.rejected`` event (at most _REJECTED_EVENTS per 5 s; the rest are counted)."""
        now = time.monotonic()
        since, sent, suppressed = self._events_window
        if now - since >= _WARN_EVERY:
            since, sent = now, 0
        if sent >= _REJECTED_EVENTS:
            self._events_window = (since, sent, suppressed + 1)
            return
        self._events_window = (since, sent + 1, 0)
        if suppressed:
            detail += f" ({suppressed} more rejections were not written as events: at most {_REJECTED_EVENTS} per 5 s)"
        self._sink.emit(
            WatchdogEvent(
                event="watchdog.rejected",
                path=self._file_path,
                pid=pid,
                uid=os.geteuid(),
                scope=None if scope is None else scope[:MAX_SCOPE_CHARS],
                outcome=outcome,
                detail=f"run {self._run_id!r}: {detail}",
            )
        )

    # -- the FIFO under the path ------------------------------------------------------------------------------

    def _check_fifo(self) -> None:
        """Every 0.1 s at most (one ``lstat``): recreate the FIFO if the path no longer names it.

        A FIFO there is another server's (torch's replaces the path when it starts): left to it, reported
        once; the clients that keep this FIFO open are still served. Nothing there, or a regular file (which
        torch's clients would write their requests into, unread), is reported once and a new FIFO is made.
        """
        now = time.monotonic()
        if now - self._fifo_checked_at < min(_SWEEP_EVERY, self._max_interval) or self._rfd < 0:
            return
        self._fifo_checked_at = now
        try:
            st: os.stat_result | None = os.lstat(self._file_path)
        except OSError:
            st = None
        there = (0, 0) if st is None else (st.st_dev, st.st_ino)
        if there == self._fifo_id:
            self._path_seen = None
            return
        first = there != self._path_seen
        self._path_seen = there
        if st is not None and stat.S_ISFIFO(st.st_mode):
            if first:
                self._replaced(
                    "is now another FIFO (another server's: torch's replaces the path when it starts); left to it, "
                    "and the clients that keep this server's FIFO open are still served"
                )
            return
        what = "is gone" if st is None else f"is now a {_kind(st.st_mode)} (torch's clients write into it, unread)"
        self.register_timers(self._read_requests())  # what the old FIFO holds, before it is closed
        old_marker = self._marker
        try:
            rfd, wfd = make_fifo(self._file_path, before_open=self._publish)
        except WatchdogError as exc:
            if first:
                self._replaced(f"{what}; it cannot be recreated, so only clients that keep it open are served: {exc}")
            return
        if old_marker >= 0 and old_marker != self._marker:
            withdraw_marker(self._file_path, old_marker)
        new = os.fstat(rfd)
        with self._fd_lock:
            old = (self._rfd, self._wfd)
            self._poller.unregister(old[0])
            self._rfd, self._wfd = rfd, wfd
            self._poller.register(rfd, select.POLLIN)
            for fd in old:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fifo_id = (new.st_dev, new.st_ino)
        self._fifos.add(self._fifo_id)
        self._pending, self._skipping, self._path_seen = b"", False, None
        self._replaced(f"{what}; a new FIFO was made at the path (clients that kept the old one open reopen it)")

    def _replaced(self, detail: str) -> None:
        self._sink.emit(
            WatchdogEvent(
                event="watchdog.fifo_replaced",
                path=self._file_path,
                detail=f"run {self._run_id!r}: the timer FIFO {self._file_path!r} {detail}",
            )
        )

    def clear_timers(self, worker_pids: set[int]) -> None:
        """Drop every timer of ``worker_pids`` and of processes no longer running."""
        self._swept_at = time.monotonic()
        pids = {pid for pid, _ in self._timers}
        gone = {pid for pid in pids if pid in worker_pids or not self.is_process_running(pid)}
        for key in [key for key in self._timers if key[0] in gone]:
            self._drop_timer(key)
        armed = {pid for pid, _ in self._timers} | self._held()  # a worker being judged keeps its handle
        for pid in [p for p in self._procs if p not in armed]:
            ref = self._procs[pid]
            if ref is not None and _running(ref):
                continue  # between two regions: its stack file must outlive them, for its next hang
            del self._procs[pid]
            self._who.pop(pid, None)
            self._set_refused(pid, None)
            if ref is not None:
                ref.close()
                _remove_stack(stack_path(self._file_path, pid, ref.start))

    def get_expired_timers(self, deadline: float) -> dict[int, list[FileTimerRequest]]:
        """Timers whose expiration time is at or before ``deadline`` (epoch seconds), by pid."""
        expired: dict[int, list[FileTimerRequest]] = {}
        for request in self._timers.values():
            if request.expiration_time <= deadline:
                expired.setdefault(request.worker_pid, []).append(request)
        return expired

    def _reap_expired(self) -> None:
        now = time.time()
        held = self._held()
        expired = {pid: timers for pid, timers in self.get_expired_timers(now).items() if pid not in held}
        reaped: set[int] = set()
        if expired:
            plans = {pid: _earliest_signal(timers) for pid, timers in expired.items()}
            for timers in expired.values():
                for timer in sorted(timers, key=lambda t: t.expiration_time):
                    self._emit("timer expired", timer)
            for pid, (sig, timer) in plans.items():
                if sig <= 0:
                    reaped.add(pid)
                    logger.info(
                        "watchdog: pid %d overran %r; its signal is %d: not reaped (log only)", pid, timer.scope_id, sig
                    )
            alone = self._gather([pid for pid, (sig, _) in plans.items() if sig > 0], now, held)
            dumps = self._begin_dumps(alone)
            reaped |= self._signal_now(
                {pid: plans[pid] for pid in alone}, {p: _Facts(d, noticed=now) for p, d in dumps.items()}
            )
        reaped |= self._advance_batches()
        # Exited workers' timers are swept every 0.1 s at most (a procfs read per worker), reaped ones at once,
        # and always in run_once()'s last pass (as torch's every pass): a request read just after a sweep
        # (here the thread woke on the first of two lines) must not outlive run_once().
        if reaped or self._run_once or time.monotonic() - self._swept_at >= min(_SWEEP_EVERY, self._max_interval):
            self.clear_timers(reaped)

    def _signal_now(self, plans: dict[int, tuple[int, FileTimerRequest]], facts: dict[int, _Facts]) -> set[int]:
        """Reap each worker of ``plans`` ((signal, timer) by pid), reporting ``facts``; the pids done with."""
        reaped: set[int] = set()
        for pid, (sig, timer) in plans.items():
            self._facts[pid] = facts.get(pid, _Facts())
            if self._reap_worker(pid, sig):
                reaped.add(pid)
                if self._signalled.pop(pid, False):
                    self._emit("kill worker process", timer)
        self._facts, self._signalled = {}, {}
        return reaped

    # -- workers of one job that expire together --------------------------------------------------------------

    def _held(self) -> set[int]:
        """The pids being judged in a batch: not reaped on their own meanwhile."""
        return {pid for batch in self._batches for pid in batch.pids}

    def _world(self, pid: int) -> int | None:
        return self._who.get(pid, (Identity(), ""))[0].world_size

    def _gather(self, due: list[int], now: float, held: set[int]) -> list[int]:
        """Start a batch for each job whose expired workers (``due``) have company; the pids to reap alone now.

        Company: other workers of the job that expired too, or whose nearest deadline falls within
        ``group_window`` (the batch waits for it). Without a window, or in run_once()'s last pass, none.
        """
        if self._group_window <= 0 or self._run_once or not due:
            return due
        # A refused pid (never signalled) is reported at once and never joins a batch: a forged line must not
        # delay, nor weigh in, the judgement of the job's workers.
        alone = [pid for pid in due if self._procs.get(pid) is None]
        due = [pid for pid in due if self._procs.get(pid) is not None]
        nearest: dict[int, float] = {}
        for (pid, _), request in self._timers.items():
            if pid not in held and pid not in due and request.signal > 0 and self._procs.get(pid) is not None:
                nearest[pid] = min(nearest.get(pid, math.inf), request.expiration_time)
        until = now + self._group_window
        for batch in gather(due, list(nearest), until, world=self._world, deadline=nearest.__getitem__):
            if len(batch) == 1:
                alone.extend(batch)
                continue
            latest = max((nearest[pid] for pid in batch if pid in nearest), default=now)
            self._batches.append(_Batch(batch, set(due) & set(batch), now, min(latest, until) + _SETTLE))
        return alone

    def _next_step(self) -> float:
        """Seconds until a batch is due to be judged or to have its victims signalled (inf: no batch)."""
        steps = [
            b.judge_at - time.time() if b.hold_until is None else b.hold_until - time.monotonic() for b in self._batches
        ]
        return min(steps, default=math.inf)

    def _advance_batches(self) -> set[int]:
        """Judge the batches whose wait is over, signal the victims whose hold is over; the pids reaped."""
        reaped: set[int] = set()
        for batch in list(self._batches):
            if batch.hold_until is None and (self._run_once or time.time() >= batch.judge_at):
                reaped |= self._judge(batch)
            if batch.hold_until is not None and (self._run_once or time.monotonic() >= batch.hold_until):
                self._batches.remove(batch)
                reaped |= self._signal_victims(batch)
        return reaped

    def _judge(self, batch: _Batch) -> set[int]:
        """Dump every member still expired, judge them, signal the culprits; the victims wait for the hold."""
        now = time.time()
        expired = self.get_expired_timers(now)
        plans = {}
        for pid in batch.pids:
            sig, timer = _earliest_signal(expired[pid]) if pid in expired else (0, None)
            if sig > 0 and timer is not None:
                plans[pid] = (sig, timer)
                if pid not in batch.announced:
                    for late in sorted(expired[pid], key=lambda t: t.expiration_time):
                        self._emit("timer expired", late)
        batch.hold_until = time.monotonic()
        dumps = self._begin_dumps(list(plans))
        facts = {pid: _Facts(dumps[pid], noticed=batch.seen if pid in batch.announced else now) for pid in plans}
        if len(plans) <= 1:  # the others left their regions in time: the lone path, no judgement
            return self._signal_now(plans, facts)
        members = []
        for pid, (_, timer) in plans.items():
            armed_at, thread = self._armed.get((pid, timer.scope_id), (0.0, None))
            identity, mismatch = self._who.get(pid, (Identity(), ""))
            text, why = dumps[pid][1].text, dumps[pid][1].why
            members.append(
                assess(pid, identity, armed_at=armed_at, stack=text, thread=thread, no_stack=why, mismatch=mismatch)
            )
        verdict = judge(members, hold=self._victim_hold)
        self._sink.emit(verdict_event(self._file_path, verdict, scope=next(iter(plans.values()))[1].scope_id))
        for member in (*verdict.culprits, *verdict.victims):
            facts[member.pid].role, facts[member.pid].note = role_and_note(verdict, member, self._victim_hold)
        if verdict.culprits:  # the victims wait for the hold; those still armed after it are signalled then
            for member in verdict.victims:
                sig, timer = plans.pop(member.pid)
                ref = self._procs.get(member.pid)
                batch.victims.append(
                    _Victim(member.pid, sig, timer, None if ref is None else ref.start, facts[member.pid])
                )
            batch.hold_until = time.monotonic() + self._victim_hold
        return self._signal_now(plans, facts)

    def _signal_victims(self, batch: _Batch) -> set[int]:
        """After the hold: signal each victim still in the region it was judged in; report the others."""
        plans = {}
        for v in batch.victims:
            now = self._timers.get((v.pid, v.timer.scope_id))
            if now is not None and now.expiration_time == v.timer.expiration_time:
                plans[v.pid] = (v.sig, v.timer)
                continue
            ref = self._procs.get(v.pid)
            gone = ref is None or ref.start != v.start or not _running(ref)
            self._facts[v.pid] = v.facts
            left = "it exited during the hold" if gone else "it released its timer during the hold"
            self._report(v.pid, "exited" if gone else "released", (), f"{left} (not signalled)", timer=v.timer)
        return self._signal_now(plans, {v.pid: v.facts for v in batch.victims})

    # -- dumps and signals ------------------------------------------------------------------------------------

    def _begin_dumps(self, pids: list[int]) -> dict[int, Dumped]:
        """Ask every worker of ``pids`` that installed the dump handler for its stack at once; wait for all.

        pid -> (stack file, dump) for every pid: the dump is complete, or says why not (``_dump.wait``);
        a worker that was not asked has no file and the reason (no handler, dumps off, gone).
        """
        dumps: dict[int, Dumped] = {}
        asked: dict[int, tuple[str, _dump.Request]] = {}
        bit = 1 << (DUMP_SIGNAL - 1)
        for pid in pids:
            ref = self._procs.get(pid)
            if ref is None:  # never signalled, nor asked for a dump: its event says why
                dumps[pid] = (None, _dump.Dump(None))
                continue
            if self._dump_timeout <= 0:
                why = "stack dumps are off (dump_timeout 0)"
            elif not caught_signals(pid) & bit:  # no handler: the dump signal's default action would kill it
                why = (
                    f"the worker has no handler for the dump signal {signal_name(DUMP_SIGNAL)} (torch's "
                    "FileTimerClient installs none; distinit.watchdog.elastic's does unless dump_stacks=False), "
                    "so none was sent"
                )
            else:
                path = stack_path(self._file_path, pid, ref.start)
                request = _dump.prepare(pid, ref.start, DUMP_SIGNAL, path)
                if isinstance(request, str):
                    why = request
                elif not ref.send(DUMP_SIGNAL):
                    why = "the worker had exited before its dump was asked"
                else:
                    ref.send(_signal.SIGCONT)
                    asked[pid] = (path, request)
                    continue
            dumps[pid] = (None, _dump.Dump(None, why))
        taken = _dump.wait([request for _, request in asked.values()], self._dump_timeout)
        dumps.update({pid: (path, dump) for (pid, (path, _)), dump in zip(asked.items(), taken, strict=True)})
        return dumps

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        """Send ``signal`` to the worker that acquired the timer, after its stack dump; True when done with it.

        Never signals a pid whose process changed since the acquire (reuse), its own process, its parent,
        pid ≤ 1 or another user's process: those are logged and their timers dropped (True).
        """
        ref = self._procs.get(worker_pid)
        outcome: Outcome = "refused"
        signals: tuple[str, ...] = ()
        if ref is None:
            detail = self._refused.get(worker_pid, (None, f"pid {worker_pid} is not signalled"))[1]
        elif worker_pid in ancestors(os.getpid()):  # re-checked (a few procfs reads): never above the server
            detail = f"pid {worker_pid} was not signalled: it is an ancestor of this server (pid {os.getpid()})"
        elif not ref.matches():
            now_start = start_time(worker_pid)
            if now_start is None or now_start == ref.start:
                outcome, detail = "exited", "the worker exited before its timer expired"
            else:
                detail = (
                    f"pid {worker_pid} was not signalled: the process that acquired the timer (start time "
                    f"{ref.start}) is gone and its pid now names another process (start time {now_start})"
                )
        elif ref.send(signal):
            outcome, signals = "killed", (signal_name(signal),)
            self._signalled[worker_pid] = True
            detail = f"sent the requested {signal_name(signal)} (its effect is not waited for, as torch)"
        else:
            outcome, detail = "exited", "the worker exited before the signal"
        self._report(worker_pid, outcome, signals, detail)
        return True

    def _report(
        self,
        pid: int,
        outcome: Outcome,
        signals: tuple[str, ...],
        detail: str,
        *,
        timer: FileTimerRequest | None = None,
    ) -> None:
        """Emit the ``watchdog.expired`` event of ``pid``: who it is, its dump, its role when judged, ``detail``.

        The scopes and deadline are those of its timers now, or of ``timer`` (one it no longer holds).
        """
        ref = self._procs.get(pid)
        if timer is None:
            scopes = sorted(s for p, s in self._timers if p == pid)
            overdue = min((r.expiration_time for (p, _), r in self._timers.items() if p == pid), default=time.time())
        else:
            scopes, overdue = [timer.scope_id], timer.expiration_time
        facts = self._facts.pop(pid, _Facts())
        path, dump = facts.dump
        identity = self._who.get(pid, (Identity(), ""))[0]
        if dump.why:
            detail += f"; {'stack dump incomplete' if dump.text else 'no stack dump'}: {dump.why}"
        self._sink.emit(
            WatchdogEvent(
                event="watchdog.expired",
                path=self._file_path,
                pid=pid,
                start_time=ref.start if ref is not None else None,
                uid=os.geteuid(),
                rank=identity.rank,
                local_rank=identity.local_rank,
                world_size=identity.world_size,
                role=facts.role,
                scope=", ".join(scopes)[:MAX_SCOPE_CHARS],
                overshoot_s=round(max(0.0, (facts.noticed or time.time()) - overdue), 6),
                stack_file=path if dump.text and path is not None and _dump.file_size(path) > 0 else None,
                stack=dump.text,
                signals=signals,
                outcome=outcome,
                detail=" ".join(part for part in (f"run {self._run_id!r}:", facts.note, detail) if part),
            )
        )

    # -- reporting --------------------------------------------------------------------------------------------

    def _emit(self, name: str, request: FileTimerRequest | None) -> None:
        try:
            self._log_event(name, request)
        except Exception:
            self._warn("log_event", "watchdog: the FileTimerServer log_event callback raised", exc_info=True)

    def _reject(self, why: str) -> None:
        self._dropped["rejected"] = self._dropped.get("rejected", 0) + 1
        self._warn(
            "rejected",
            f"watchdog: dropped a timer request on {self._file_path!r}: {why} "
            f"({self._dropped['rejected']} dropped so far)",
        )

    def _warn(self, kind: str, message: str, *, exc_info: bool = False) -> None:
        """Log at most one warning of each kind every 5 s (a flooding client cannot flood the log)."""
        now = time.monotonic()
        if now - self._warned_at.get(kind, -math.inf) >= _WARN_EVERY:
            self._warned_at[kind] = now
            logger.warning(
                message, exc_info=exc_info, extra={"distinit": {"event": "watchdog.rejected", "path": self._file_path}}
            )


@dataclass
class _Facts:
    """What is reported of a worker reaped: its dump, its role and the decision when judged, when it was seen."""

    dump: Dumped = (None, _dump.Dump(None))
    role: Role | None = None
    note: str = ""
    noticed: float | None = None  # epoch seconds: when its expiry was seen (None: now)


@dataclass
class _Victim:
    """A worker judged a victim: its signal, the timer it was judged on, its start time, and its facts."""

    pid: int
    sig: int
    timer: FileTimerRequest
    start: int | None
    facts: _Facts


@dataclass
class _Batch:
    """Workers of one job whose timers expire together (``pids``; ``announced``: expired when it formed).

    ``seen`` is when the first expiry was seen (epoch seconds). Judged once the clock passes ``judge_at``
    (the last member's deadline, at most the window after the first expiry); its victims are signalled at
    ``hold_until`` (monotonic; None: not judged yet).
    """

    pids: list[int]
    announced: set[int]
    seen: float
    judge_at: float
    hold_until: float | None = None
    victims: list[_Victim] = field(default_factory=list)


def _earliest_signal(timers: list[FileTimerRequest]) -> tuple[int, FileTimerRequest]:
    """The signal torch picks: the signal of the earliest expired timer that has one (> 0), else 0 (log only)."""
    ordered = sorted(timers, key=lambda t: t.expiration_time)
    for timer in ordered:
        if timer.signal > 0:
            return timer.signal, timer
    return 0, ordered[0]


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, in words."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return f"file of mode {mode:o}"


def _running(ref: ProcessRef) -> bool:
    """Whether ``ref``'s process has not exited: one pidfd poll, or the procfs identity check without pidfds."""
    if ref.pidfd is None:
        return ref.matches()
    poller = select.poll()
    poller.register(ref.pidfd, select.POLLIN)
    return not poller.poll(0)


def _remove_stack(path: str) -> None:
    """Remove a worker's empty stack file; one holding a dump is kept: the event that reported it names it."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == 0:
            os.unlink(path)


# Its public home: reprs and pickles name distinit.watchdog.elastic, never this private module.
FileTimerServer.__module__ = "distinit.watchdog.elastic"
