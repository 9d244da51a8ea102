"""The kill ladder: stack dump → SIGCONT → SIGTERM → grace → SIGKILL → verify death (or report unkillable)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from distinit.watchdog import _dump
from distinit.watchdog._events import Outcome
from distinit.watchdog._proc import ProcessRef, state


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
        kill_group: also signal the worker's process group, when the worker leads it (not the server's).
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


class _Signaller:
    """Sends the ladder's signals to one worker (and the group it leads, when asked), recording each."""

    GROUP_SIGNALS = (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL)

    def __init__(self, proc: ProcessRef, cfg: LadderConfig, result: LadderResult) -> None:
        self.proc, self.cfg, self.result = proc, cfg, result
        self.group = cfg.kill_group and proc.leads_group

    def __call__(self, sig: int) -> bool:
        sent = self.proc.send(sig)
        if sent:
            self.result.signals.append(signal_name(sig))
            if self.group and sig in self.GROUP_SIGNALS:
                self.proc.send_group(sig)
        return sent

    def group_note(self) -> str:
        if not self.cfg.kill_group or self.group:
            return ""
        return (
            f" kill_group: pid {self.proc.pid} does not lead its process group (pgid {self.proc.pgid}, "
            "shared with its launcher or sibling ranks), so the worker alone was signalled."
        )


def run_ladder(proc: ProcessRef, dump_signal: int, stack_path: str | None, cfg: LadderConfig) -> LadderResult:
    """Kill one worker, escalating; never signals anything but ``proc`` (and the group it leads, when asked)."""
    result = LadderResult(outcome="exited")
    if not proc.alive():
        result.detail = "the worker had already exited"
        return result
    send = _Signaller(proc, cfg, result)
    if cfg.dump_stacks and dump_signal and stack_path is not None:
        offset = max(_dump.file_size(stack_path), 0)
        if send(dump_signal):
            send(signal.SIGCONT)  # a stopped worker runs its dump handler only once continued
            result.stack = _dump.collect(stack_path, offset, cfg.dump_timeout)
    else:
        send(signal.SIGCONT)
    _terminate(proc, send, cfg, result)
    result.detail += send.group_note()
    return result


def _terminate(proc: ProcessRef, send: _Signaller, cfg: LadderConfig, result: LadderResult) -> None:
    """SIGTERM → grace → SIGKILL → verify death, filling in ``result``."""
    if not send(signal.SIGTERM):
        result.dead_at = time.monotonic()
        result.detail = "the worker exited before SIGTERM"
        return
    if cfg.grace > 0 and proc.wait_exit(cfg.grace):
        result.outcome, result.dead_at = "killed", time.monotonic()
        result.detail = "died after SIGTERM"
        return
    if not send(signal.SIGKILL) and not proc.matches():
        result.outcome, result.dead_at = "killed", time.monotonic()
        result.detail = "died after SIGTERM"
        return
    if proc.wait_exit(cfg.verify_timeout):
        result.outcome, result.dead_at = "killed", time.monotonic()
        result.detail = "died after SIGKILL" if cfg.grace > 0 else "died (grace 0: SIGTERM then SIGKILL)"
        return
    st = state(proc.pid)
    result.outcome = "unkillable"
    result.detail = f"still alive {cfg.verify_timeout:.1f} s after SIGKILL in state {st!r}" + (
        " (uninterruptible sleep: stuck in the kernel, e.g. a hung NFS/driver call)" if st == "D" else ""
    )
