"""The kill ladder: stack dump → SIGCONT → SIGTERM → grace → SIGKILL → verify death (or report unkillable)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

from distinit.watchdog._events import Outcome
from distinit.watchdog._proc import ProcessRef, state

MAX_STACK_BYTES = 64 * 1024


def signal_name(sig: int) -> str:
    """``SIGTERM``, ``SIGRTMIN+6``, ... for a signal number."""
    if signal.SIGRTMIN < sig <= signal.SIGRTMAX:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass(frozen=True)
class LadderConfig:
    """How hard and how fast to kill.

    Attributes:
        grace: seconds between SIGTERM and SIGKILL (0: SIGKILL right after SIGTERM).
        dump_stacks: ask the worker's faulthandler for a stack dump first.
        kill_group: also signal the worker's process group (when it is not the server's).
        dump_timeout: the longest wait for the dump to finish.
        verify_timeout: how long after SIGKILL before the worker is reported unkillable.
    """

    grace: float = 5.0
    dump_stacks: bool = True
    kill_group: bool = False
    dump_timeout: float = 0.5
    verify_timeout: float = 5.0


@dataclass
class LadderResult:
    """What the ladder did and saw."""

    outcome: Outcome
    signals: list[str] = field(default_factory=list)
    stack: str | None = None
    dead_at: float | None = None
    detail: str = ""


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _collect_dump(path: str, offset: int, timeout: float) -> str | None:
    """Wait until the dump written after ``offset`` stops growing (3 ms quiet) or ``timeout``; return it."""
    deadline = time.monotonic() + timeout
    last, quiet_since = offset, 0.0
    while time.monotonic() < deadline:
        size = _file_size(path)
        now = time.monotonic()
        if size > last:
            last, quiet_since = size, now
        elif size > offset and now - quiet_since >= 0.003:
            break
        time.sleep(0.0005)
    if last <= offset:
        return None
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(min(last - offset, MAX_STACK_BYTES)).decode("utf-8", "replace")


def run_ladder(proc: ProcessRef, dump_signal: int, stack_path: str | None, cfg: LadderConfig) -> LadderResult:
    """Kill one worker, escalating; never signals anything but ``proc`` (and its group when asked)."""
    result = LadderResult(outcome="exited")

    def send(sig: int) -> bool:
        sent = proc.send(sig)
        if sent:
            result.signals.append(signal_name(sig))
            if cfg.kill_group and sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):
                proc.send_group(sig)
        return sent

    if not proc.alive():
        result.detail = "the worker had already exited"
        return result
    if cfg.dump_stacks and dump_signal and stack_path is not None:
        offset = max(_file_size(stack_path), 0)
        if send(dump_signal):
            send(signal.SIGCONT)  # a stopped worker runs its dump handler only once continued
            result.stack = _collect_dump(stack_path, offset, cfg.dump_timeout)
    else:
        send(signal.SIGCONT)
    if not send(signal.SIGTERM):
        result.dead_at = time.monotonic()
        result.detail = "the worker exited before SIGTERM"
        return result
    if cfg.grace > 0 and proc.wait_exit(cfg.grace):
        result.outcome, result.dead_at = "killed", time.monotonic()
        result.detail = "died after SIGTERM"
        return result
    if not send(signal.SIGKILL) and not proc.matches():
        result.outcome, result.dead_at = "killed", time.monotonic()
        result.detail = "died after SIGTERM"
        return result
    if proc.wait_exit(cfg.verify_timeout):
        result.outcome, result.dead_at = "killed", time.monotonic()
        result.detail = "died after SIGKILL" if cfg.grace > 0 else "died (grace 0: SIGTERM then SIGKILL)"
        return result
    st = state(proc.pid)
    result.outcome = "unkillable"
    result.detail = f"still alive {cfg.verify_timeout:.1f} s after SIGKILL in state {st!r}" + (
        " (uninterruptible sleep: stuck in the kernel, e.g. a hung NFS/driver call)" if st == "D" else ""
    )
    return result
