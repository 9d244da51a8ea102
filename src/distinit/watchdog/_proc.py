"""Process identity from the kernel: pidfds, procfs start times, signals that cannot hit a reused pid."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from dataclasses import dataclass, field

_PIDFD_SUPPORTED: bool | None = None
#: ``pidfd_send_signal`` flag (Linux >= 6.9, ``linux/pidfd.h``): signal the process group the pidfd's process leads.
PIDFD_SIGNAL_PROCESS_GROUP = 4
# True once the kernel refused that flag (EINVAL, before 6.9): groups are then signalled by number (``killpg``).
_PIDFD_GROUP_REFUSED = False


def pidfd_supported() -> bool:
    """Whether this kernel and Python offer ``pidfd_open`` and ``pidfd_send_signal`` (Linux ≥ 5.3)."""
    global _PIDFD_SUPPORTED
    if _PIDFD_SUPPORTED is None:
        ok = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
        if ok:
            try:
                fd = os.pidfd_open(os.getpid())
            except OSError:  # ENOSYS on old kernels, EPERM under some seccomp profiles
                ok = False
            else:
                os.close(fd)
        _PIDFD_SUPPORTED = ok
    return _PIDFD_SUPPORTED


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (procfs field 22), None if it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def state(pid: int) -> str | None:
    """The process's one-letter state (R, S, D, T, t, Z, ...), None if it does not exist."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def tgid(pid: int) -> int | None:
    """The thread-group id (the process id) that ``pid`` belongs to; None if there is no such task.

    ``/proc/<tid>`` exists for every thread, not only for process leaders, and ``kill(tid)`` signals the
    whole process: a thread id is accepted only where it equals its ``Tgid``.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def maps_file(pid: int, dev: int, ino: int) -> bool:
    """Whether process ``pid`` has the file ``(dev, ino)`` mapped (``/proc/<pid>/maps``).

    A slot table mapped by the process is proof that the process itself created it: nobody else, short of
    ptrace, can make another process map a file.
    """
    want_dev = f"{os.major(dev):02x}:{os.minor(dev):02x}".encode()
    want_ino = str(ino).encode()
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) >= 5 and fields[4] == want_ino and fields[3] == want_dev:
                    return True
    except OSError:
        return False
    return False


def parent_pid(pid: int) -> int | None:
    """The parent's pid of process ``pid`` (procfs field 4), None if there is no such process."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def ancestors(pid: int, *, limit: int = 256) -> list[int]:
    """The pids above ``pid``, its parent first, up to (not including) pid 0; at most ``limit`` of them.

    One ``/proc/<p>/stat`` read per level (a few microseconds each).
    """
    found: list[int] = []
    current = parent_pid(pid)
    while current is not None and current > 0 and len(found) < limit and current not in found:
        found.append(current)
        current = parent_pid(current)
    return found


#: The most bytes of ``/proc/<pid>/environ`` read (a larger environment is not looked into).
MAX_ENVIRON_BYTES = 1 << 20


def read_environ(pid: int) -> dict[str, str] | None:
    """The environment process ``pid`` started with (``/proc/<pid>/environ``); None when unreadable or > 1 MiB.

    Unreadable: another user's process, a non-dumpable one, or gone. Only what was there at exec is seen.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(MAX_ENVIRON_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_ENVIRON_BYTES:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode("ascii", "replace"): v.decode("ascii", "replace") for k, _, v in pairs}


def holds_file(pid: int, files: set[tuple[int, int]], *, limit: int = 65536) -> bool:
    """Whether process ``pid`` has one of ``files`` ((st_dev, st_ino) pairs) open (``/proc/<pid>/fd``).

    One ``stat`` per open descriptor, at most ``limit`` descriptors looked at; False when unreadable.
    """
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names[:limit]:
        try:
            st = os.stat(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in files:
            return True
    return False


def owner_uid(pid: int) -> int | None:
    """The real uid owning ``/proc/<pid>``, None if the process does not exist."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except (FileNotFoundError, ProcessLookupError):
        return None


def is_protected(pid: int) -> bool:
    """True for pids the watchdog must never signal: itself, its parent, init and the kernel's pid 0."""
    return pid <= 1 or pid == os.getpid() or pid == os.getppid()


@dataclass
class ProcessRef:
    """A verified handle on one live process: pid, start time and (where supported) a pidfd.

    With a pidfd, signals go through ``pidfd_send_signal``, which fails with ``ProcessLookupError`` once the
    process has exited, so a recycled pid can never be hit. Without one, the start time is re-read from procfs
    right before every signal and the signal is skipped when it no longer matches.
    """

    pid: int
    start: int
    pidfd: int | None = None
    pgid: int | None = None
    _closed: bool = field(default=False, repr=False)

    @classmethod
    def open(cls, pid: int, expected_start: int | None = None, *, use_pidfd: bool = True) -> ProcessRef | None:
        """Open a handle on ``pid``; None when it is gone, protected, or its start time is not the expected."""
        if is_protected(pid) or tgid(pid) != pid:
            return None
        pidfd: int | None = None
        if use_pidfd and pidfd_supported():
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                return None
        # Read the start time *after* opening the pidfd: if it still matches, the pidfd names that process.
        start = start_time(pid)
        if start is None or (expected_start is not None and start != expected_start) or state(pid) == "Z":
            if pidfd is not None:
                os.close(pidfd)
            return None
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            pgid = None
        return cls(pid=pid, start=start, pidfd=pidfd, pgid=pgid)

    def matches(self) -> bool:
        """Whether the pid still names the same, not yet exited process (and not a thread of another)."""
        return (
            start_time(self.pid) == self.start
            and state(self.pid) not in (None, "Z", "X")
            and tgid(self.pid) == self.pid
        )

    def holds_pid(self) -> bool:
        """Whether the pid still names this process, alive or dead but not yet reaped (a zombie keeps its pid).

        While it does, no other process can have that number, as pid or as process group id.
        """
        return start_time(self.pid) == self.start and tgid(self.pid) == self.pid

    @property
    def leads_group(self) -> bool:
        """Whether the process leads its own process group (``setsid``/``setpgid``), so the group is its own."""
        return self.pgid == self.pid

    def alive(self) -> bool:
        """Whether the process has not exited (a zombie counts as exited)."""
        if self.pidfd is not None and not self._closed:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            if poller.poll(0):
                return False
        return self.matches()

    def send(self, sig: int) -> bool:
        """Send ``sig`` to this exact process; False (nothing sent) if it has exited or its pid was reused."""
        if is_protected(self.pid):
            return False
        try:
            if self.pidfd is not None and not self._closed:
                signal.pidfd_send_signal(self.pidfd, sig)
                return True
            if not self.matches():
                return False
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def send_group(self, sig: int) -> bool:
        """Send ``sig`` to the process group the worker leads; False (nothing sent) for any other group.

        A worker in its launcher's group (``mp.spawn``, a ``Popen`` supervisor) shares it with the launcher
        and its sibling ranks: signalling that group would kill them all.

        The worker need not be alive: its children outlive it. Where the kernel allows (Linux >= 6.9), the
        group is named by the worker's pidfd (``PIDFD_SIGNAL_PROCESS_GROUP``), which reaches exactly the
        group the worker created even once the worker was reaped and its number given to someone else.
        Elsewhere it is named by number (``killpg``), and only while the worker holds that number (alive or
        a zombie): after its launcher reaped it, the number may name another process's group, and nothing
        is sent.
        """
        global _PIDFD_GROUP_REFUSED
        if not self.leads_group or self.pgid is None or self.pgid <= 1 or self.pgid == os.getpgrp():
            return False
        if self.pidfd is not None and not self._closed and not _PIDFD_GROUP_REFUSED:
            try:
                signal.pidfd_send_signal(self.pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # ESRCH: nobody is left in the group; EPERM: not ours to signal
                    return False
                _PIDFD_GROUP_REFUSED = True  # a kernel before 6.9: name the group by its number
            else:
                return True
        if not self.holds_pid():
            return False
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; True if it has."""
        deadline = time.monotonic() + timeout
        if self.pidfd is not None and not self._closed:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            while True:
                left = deadline - time.monotonic()
                if poller.poll(max(0, int(left * 1000) + 1)):
                    return True
                if left <= 0:
                    return not self.matches()
        while True:
            if not self.matches():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        if self.pidfd is not None and not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
