"""Stack dumps: the worker's faulthandler writes ``<pid>.<start>.stack``; the server reads what was added.

The server reads a dump once it is complete, which the kernel shows: the dump signal is no longer pending
and no thread runs its handler any more (a handler blocks its own signal while it runs). A dump is never cut
at a pause in the writing (a worker descheduled mid-dump on a loaded host), nor given up on while the worker
only waits for a CPU; one that cannot come says why.

Both sides open the file without following links and without blocking, and check it is a regular file
before use, so a FIFO or symlink planted under the name can neither hang nor redirect them.
"""

from __future__ import annotations

import faulthandler
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from distinit.watchdog._proc import start_time

MAX_STACK_BYTES = 64 * 1024
#: The longest wait for a dump whose worker is runnable but gets no CPU (see :func:`wait`).
STARVED_LIMIT_S = 10.0


def install(stack_path: str, dump_signal: int) -> IO[bytes]:
    """Open ``stack_path`` (0600, append) and register faulthandler on ``dump_signal`` to write into it.

    Raises:
        OSError: the file cannot be opened or is not a regular file.
        ValueError, RuntimeError: faulthandler refused the signal.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(stack_path, flags, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{stack_path!r} is not a regular file")
    fh = os.fdopen(fd, "ab", buffering=0)
    try:
        faulthandler.register(dump_signal, file=fh, all_threads=True, chain=False)
    except BaseException:
        fh.close()
        raise
    return fh


def file_size(path: str) -> int:
    """The size of the regular file ``path``; -1 when it is missing or not a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


def _read_regular(path: str, offset: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` of the regular file ``path``; a FIFO or symlink gives nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, size, offset) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Dump:
    """What a dump request gave: the text written (None: nothing), and why it is not a complete dump."""

    text: str | None
    why: str = ""  # "" when the dump is complete


@dataclass(frozen=True)
class _Task:
    """One thread of the worker, as ``/proc/<pid>/task/<tid>/status`` shows it."""

    state: str
    pending: int  # SigPnd | ShdPnd: signals sent to it, or to the process, not yet taken
    blocked: int  # SigBlk: a signal handler blocks its own signal while it runs (faulthandler does, chain=False)
    caught: int  # SigCgt: the signals the process has handlers for


def _tasks(pid: int) -> dict[int, _Task]:
    """The threads of process ``pid`` (empty when it is gone)."""
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()]
    except OSError:
        return {}
    tasks = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", "rb") as fh:
                fields = dict(line.split(b":", 1) for line in fh if b":" in line)
            tasks[tid] = _Task(
                state=fields[b"State"].split()[0].decode("ascii", "replace"),
                pending=int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16),
                blocked=int(fields[b"SigBlk"], 16),
                caught=int(fields[b"SigCgt"], 16),
            )
        except (OSError, KeyError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return tasks


def _describe(tasks: dict[int, _Task]) -> str:
    """``thread 12 in state D, thread 13 in state R``: where the threads are."""
    return ", ".join(f"thread {tid} in state {t.state}" for tid, t in sorted(tasks.items()))


@dataclass
class Request:
    """A stack dump about to be asked of one worker (:func:`prepare`, before its dump signal is sent).

    It remembers what the kernel showed before the signal: the worker's threads and which of them already
    blocked the signal. Afterwards, a thread of those that blocks the signal is running the dump handler
    (the kernel blocks a handler's own signal while it runs), and the dump is complete once the signal is
    neither pending nor blocked by such a thread, and the stack file grew: the handler returned.
    """

    pid: int
    start: int
    sig: int
    path: str
    offset: int
    threads: frozenset[int]
    blocked_before: frozenset[int]

    def look(self) -> tuple[Dump | None, bool]:
        """(the finished dump or None while it is still coming, whether a CPU is all it waits for)."""
        bit = 1 << (self.sig - 1)
        tasks = _tasks(self.pid) if start_time(self.pid) == self.start else {}
        size = file_size(self.path)
        if not tasks or all(t.state in ("Z", "X") for t in tasks.values()):
            if size > self.offset:
                return Dump(self._read(size), "the worker exited during or right after its dump (it may be cut)"), False
            return Dump(None, "the worker exited before it dumped its stack"), False
        pending = any(t.pending & bit for t in tasks.values())
        dumping = self._dumping(tasks)
        if not pending and not dumping and size > self.offset:
            return Dump(self._read(size)), False
        if dumping:  # the handler runs: writing, or waiting for a CPU to write
            return None, any(t.state == "R" for t in dumping.values())
        if pending:  # not taken yet: a thread that does not block it takes it once it runs
            return None, any(t.state == "R" and not t.blocked & bit for t in tasks.values())
        return None, False  # taken, nothing written yet: its handler is about to run (or is not the dump's)

    def why_not(self) -> str:
        """Why the dump is not complete, from what the kernel shows now (the wait for it is over)."""
        bit = 1 << (self.sig - 1)
        tasks = _tasks(self.pid)
        written = max(file_size(self.path) - self.offset, 0)
        name = f"signal {self.sig}"
        dumping = self._dumping(tasks)
        if dumping:
            return f"its dump was still being written ({written} bytes so far): {_describe(dumping)}"
        if any(t.pending & bit for t in tasks.values()):
            takers = {tid: t for tid, t in tasks.items() if not t.blocked & bit}
            if not takers:
                return f"the dump {name} is still pending: every thread of the worker blocks it"
            return (
                f"the dump {name} is still pending, no thread took it: {_describe(takers)}"
                " (D: uninterruptible, in the kernel; T: stopped; R: runnable, but given no CPU)"
            )
        if tasks and not any(t.caught & bit for t in tasks.values()):
            return f"the worker no longer has a handler for the dump {name} (faulthandler unregistered)"
        return (
            f"the worker took the dump {name} but wrote nothing to its stack file: its handler for it is not "
            "the watchdog's faulthandler dump (replaced by other code?)"
        )

    def _dumping(self, tasks: dict[int, _Task]) -> dict[int, _Task]:
        """The threads running the dump handler: those that block the signal now but did not before it."""
        bit = 1 << (self.sig - 1)
        fresh = self.threads - self.blocked_before
        return {tid: t for tid, t in tasks.items() if t.blocked & bit and tid in fresh}

    def _read(self, size: int) -> str | None:
        data = _read_regular(self.path, self.offset, min(size - self.offset, MAX_STACK_BYTES))
        return data.decode("utf-8", "replace") or None


def prepare(pid: int, start: int, sig: int, path: str) -> Request | str:
    """A :class:`Request` for the dump of process ``pid`` (started at ``start``), before ``sig`` is sent.

    Returns why no dump can be asked instead: the process is gone, its stack file is missing, or it has no
    handler for ``sig`` (whose default action, for a real-time signal, would kill it).
    """
    tasks = _tasks(pid) if start_time(pid) == start else {}
    if not tasks:
        return "the worker had exited before its dump was asked"
    bit = 1 << (sig - 1)
    if not any(t.caught & bit for t in tasks.values()):
        return f"the worker has no handler for the dump signal {sig} (faulthandler not registered): not sent"
    offset = file_size(path)
    if offset < 0:
        return f"its stack file {path!r} is missing or not a regular file: no dump asked"
    blocked = frozenset(tid for tid, t in tasks.items() if t.blocked & bit)
    return Request(pid, start, sig, path, offset, frozenset(tasks), blocked)


def wait(requests: Sequence[Request], timeout: float) -> list[Dump]:
    """Wait until every dump of ``requests`` is complete (its handler returned), or cannot come; one each.

    ``timeout`` bounds the time a dump makes no progress of its own: its signal not taken, or its handler
    not running, while no thread that could go on is runnable (in the kernel, stopped, gone). Time in which
    a runnable worker only waits for a CPU is not charged: on a loaded host the dump comes when the worker
    runs. :data:`STARVED_LIMIT_S` bounds the whole wait. A dump not complete in time says why (``why``).
    """
    results: dict[int, Dump] = {}
    charged = [0.0] * len(requests)
    began = last = time.monotonic()
    pause = 0.0005
    while len(results) < len(requests):
        now = time.monotonic()
        step, last = now - last, now
        for i, request in enumerate(requests):
            if i in results:
                continue
            dump, runnable = request.look()
            if dump is not None:
                results[i] = dump
                continue
            if not runnable:
                charged[i] += step
            if charged[i] >= timeout:
                results[i] = _cut(request, f"{request.why_not()}; gave up after {timeout:g} s without progress")
            elif now - began >= STARVED_LIMIT_S:
                results[i] = _cut(request, f"{request.why_not()}; gave up after {STARVED_LIMIT_S:g} s in all")
        if len(results) < len(requests):
            time.sleep(pause)
            pause = min(pause * 1.5, 0.01)
    return [results[i] for i in range(len(requests))]


def _cut(request: Request, why: str) -> Dump:
    """The dump given up on: what was written so far (maybe cut), and why it is not complete."""
    size = file_size(request.path)
    return Dump(request._read(size) if size > request.offset else None, why)
