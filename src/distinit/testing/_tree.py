"""A rank's process tree: contained while it runs, stopped as a whole, never through a recycled pid.

Three rules make teardown safe and complete:

- **Held, not numbered.** A process is signalled only through a :class:`Held` handle: a pidfd
  (``os.pidfd_open``), which keeps naming the same process after its pid is recycled. Where the
  kernel has no pidfds (< 5.3), the handle remembers the process's start time and re-checks it
  before each signal. No bare pid and no process group id is ever signalled: a rank's pid is
  reaped by the fork server, not by us, and may belong to an unrelated process a moment later.
- **Contained.** Each rank makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a
  descendant that escapes with ``start_new_session=True`` or a ``setsid`` double fork is
  re-parented to the rank instead of to init, and stays in the rank's tree.
- **Stopped top-down, killed at once.** Each process of the tree is frozen with ``SIGSTOP``
  before its children are listed, so nothing forks behind the walk; a child is taken only after
  its pidfd is open and its parent is re-read as a held process. Then everything is SIGKILLed.

Linux only; imports only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import time
from dataclasses import dataclass

__all__ = ["Held", "become_subreaper", "kill_tree", "reap_own_tree"]

_PR_SET_CHILD_SUBREAPER = 36
#: How long to wait for one process to reach the stopped state before listing its children.
STOP_WAIT = 0.5


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (a no-op where prctl is missing)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, start time)`` of ``pid`` from ``/proc``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), int(fields[19])


@dataclass
class Held:
    """One process we may signal: a pidfd, or (no pidfds) its pid and recorded start time."""

    pid: int
    pidfd: int | None
    started: int | None = None

    @classmethod
    def open(cls, pid: int) -> Held | None:
        """A handle on the process that has ``pid`` now (None when there is none)."""
        try:
            return cls(pid, os.pidfd_open(pid))
        except ProcessLookupError:
            return None
        except (AttributeError, OSError):  # no pidfds: identify it by its start time instead
            stat = _stat(pid)
            return None if stat is None else cls(pid, None, stat[2])

    def exited(self) -> bool:
        """The held process has exited (a recycled pid never makes this False again)."""
        if self.pidfd is None:
            stat = _stat(self.pid)
            return stat is None or stat[2] != self.started or stat[0] in ("Z", "X")
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(0))

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the held process; False when it has already exited."""
        if self.pidfd is None:
            if self.exited():
                return False
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signum)
                return True
            return False
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self) -> None:
        """Release the pidfd (the process itself is not touched)."""
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None
            self.started = -1  # a closed handle never matches a process again


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` now (``/proc/<pid>/task/*/children``; a scan where that is missing)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                kids.extend(int(k) for k in handle.read().split())
        except FileNotFoundError:  # kernel without CONFIG_PROC_CHILDREN
            return [int(p) for p in os.listdir("/proc") if p.isdigit() and (_stat(int(p)) or ("", 0, 0))[1] == pid]
        except OSError:
            continue
    return kids


def _hold_child(pid: int, parent: Held | None) -> Held | None:
    """A handle on ``pid`` if it is a child of ``parent`` (None: this process), verified after opening."""
    held = Held.open(pid)
    if held is None:
        return None
    stat = _stat(pid)
    parent_pid = os.getpid() if parent is None else parent.pid
    # Read after opening: if the held process is still there, what was read was about it; if the
    # parent is still there too, its pid was not recycled, so the child really is its child.
    if stat is None or stat[1] != parent_pid or held.exited() or (parent is not None and parent.exited()):
        held.close()
        return None
    return held


def _wait_stopped(held: Held, deadline: float) -> None:
    """Wait (bounded) until ``held`` is stopped or gone, so it forks no child behind our listing."""
    while time.monotonic() < deadline:
        stat = _stat(held.pid)
        if stat is None or stat[0] in ("T", "t", "Z", "X") or held.exited():
            return
        time.sleep(0.001)


def _stop_below(root: Held | None, timeout: float) -> list[Held]:
    """Freeze every descendant of ``root`` (None: this process) top-down; the handles, root excluded."""
    deadline = time.monotonic() + timeout
    held: list[Held] = []
    queue: list[Held | None] = [root]
    while queue:
        parent = queue.pop()
        if parent is not None:
            _wait_stopped(parent, min(deadline, time.monotonic() + STOP_WAIT))
        for pid in _children(os.getpid() if parent is None else parent.pid):
            child = _hold_child(pid, parent)
            if child is not None:
                child.signal(signal.SIGSTOP)
                held.append(child)
                queue.append(child)
    return held


def kill_tree(root: Held, *, timeout: float = 2.0) -> None:
    """SIGKILL ``root`` and every descendant it holds (contained by the subreaper); ``root`` stays open."""
    if not root.signal(signal.SIGSTOP):
        return  # already exited: nothing of its tree is held any more
    below = _stop_below(root, timeout)
    for process in [root, *below]:
        process.signal(signal.SIGKILL)
    for process in below:
        process.close()


def reap_own_tree(*, timeout: float = 2.0) -> None:
    """Kill and reap every descendant of this process (a rank about to exit; bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        below = _stop_below(None, deadline - time.monotonic())
        for process in below:
            process.signal(signal.SIGKILL)
            process.close()
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return  # no child left, not even a zombie
        if not below:
            time.sleep(0.005)
