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
        dump_timeout: the longest a dump may make no progress before it is given up on (time in which a
            runnable worker only waits for a CPU does not count, see ``_dump.wait``).
        verify_timeout: how long after SIGKILL before the worker is reported unkillable.
        group_window: when a worker expires and other workers' deadlines fall within this many seconds,
            wait for them and judge them together (culprit first, see ``_culprit``); 0 disables it.
        victim_hold: seconds between killing the culprit and killing the victims still in their region.
    """

    grace: float = 5.0
    dump_stacks: bool = True
    kill_group: bool = False
    dump_timeout: float = 0.5
    verify_timeout: float = 5.0
    group_window: float = 1.0
    victim_hold: float = 2.0


@dataclass
class LadderResult:
    """What the ladder did and saw."""

    outcome: Outcome
    signals: list[str] = field(default_factory=list)
    stack: str | None = None
    dead_at: float | None = None
    detail: str = ""
    no_stack: str = ""  # why there is no complete stack dump ("" when there is one, or none was asked)


class _Signaller:
    """Sends the ladder's signals to one worker (and the group it leads, when asked), recording each."""

    GROUP_SIGNALS = (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL)

    def __init__(self, proc: ProcessRef, cfg: LadderConfig, result: LadderResult) -> None:
        self.proc, self.cfg, self.result = proc, cfg, result
        self.group = cfg.kill_group and proc.leads_group

    def __call__(self, sig: int) -> bool:
        """Send ``sig``: to the worker's group first (when asked), then to the worker; whether either was sent.

        The group goes first: the worker is in it, and signalled first it may die, and be reaped by its
        launcher, before the group is signalled; its group could then no longer be named by its number.
        """
        grouped = self.group and sig in self.GROUP_SIGNALS and self.proc.send_group(sig)
        sent = self.proc.send(sig) or grouped
        if sent:
            self.result.signals.append(signal_name(sig))
        return sent

    def group_note(self) -> str:
        if not self.cfg.kill_group or self.group:
            return ""
        return (
            f" kill_group: pid {self.proc.pid} does not lead its process group (pgid {self.proc.pgid}, "
            "shared with its launcher or sibling ranks), so the worker alone was signalled."
        )


def begin_dump(
    proc: ProcessRef, dump_signal: int, stack_path: str | None, cfg: LadderConfig
) -> tuple[LadderResult, _dump.Request | None]:
    """Ask a live worker for its stack (dump signal, then SIGCONT so a stopped one runs its handler).

    Returns a result recording the signals sent, and the dump asked (None: none was; the result's
    ``no_stack`` says why where one was wanted). Several workers can be asked before any dump is collected.
    """
    result = LadderResult(outcome="exited")
    send = _Signaller(proc, cfg, result)
    if cfg.dump_stacks and dump_signal and stack_path is not None:
        request = _dump.prepare(proc.pid, proc.start, dump_signal, stack_path)
        if isinstance(request, str):
            result.no_stack = request
        elif send(dump_signal):
            send(signal.SIGCONT)  # a stopped worker runs its dump handler only once continued
            return result, request
        else:
            result.no_stack = "the worker had exited before its dump was asked"
    return result, None


def take_dumps(asked: list[tuple[LadderResult, _dump.Request]], cfg: LadderConfig) -> None:
    """Wait for the dumps ``asked`` (all at once) and record each in its result: its stack, or why none."""
    for (result, _), dump in zip(asked, _dump.wait([r for _, r in asked], cfg.dump_timeout), strict=True):
        result.stack, result.no_stack = dump.text, dump.why


def run_ladder(
    proc: ProcessRef,
    dump_signal: int,
    stack_path: str | None,
    cfg: LadderConfig,
    *,
    dumped: LadderResult | None = None,
) -> LadderResult:
    """Kill one worker, escalating; never signals anything but ``proc`` (and the group it leads, when asked).

    ``dumped`` is the result of a dump already taken (:func:`begin_dump` and its collected stack): the
    ladder then goes straight to SIGTERM.
    """
    if not proc.alive():
        result = dumped or LadderResult(outcome="exited")
        result.detail = "the worker had already exited"
        return result
    if dumped is None:
        dumped, request = begin_dump(proc, dump_signal, stack_path, cfg)
        if request is not None:
            take_dumps([(dumped, request)], cfg)
    send = _Signaller(proc, cfg, dumped)
    if not dumped.signals:  # no dump was asked for: still continue a stopped worker before SIGTERM
        send(signal.SIGCONT)
    _terminate(proc, send, cfg, dumped)
    dumped.detail += send.group_note()
    return dumped


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
