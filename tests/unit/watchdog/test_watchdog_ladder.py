"""The ladder's decisions, on stand-in process handles (no real process can be made unkillable on demand)."""

from __future__ import annotations

import signal

from distinit.watchdog._ladder import LadderConfig, run_ladder
from distinit.watchdog._proc import ProcessRef


class StandIn(ProcessRef):
    """A handle that records signals; ``dies_on`` says which signal ends it (None: nothing does, like D-state)."""

    def __init__(self, dies_on: int | None, gone: bool = False, pgid: int | None = None) -> None:
        super().__init__(pid=2**22 + 7, start=1, pgid=pgid)
        self.sent: list[int] = []
        self.group_sent: list[int] = []
        self.dies_on = dies_on
        self.dead = gone

    def alive(self) -> bool:
        return not self.dead

    def matches(self) -> bool:
        return not self.dead

    def send(self, sig: int) -> bool:
        if self.dead:
            return False
        self.sent.append(sig)
        if sig == self.dies_on:
            self.dead = True
        return True

    def wait_exit(self, timeout: float) -> bool:
        return self.dead

    def send_group(self, sig: int) -> bool:
        self.group_sent.append(sig)
        return True


def test_sigterm_enough_with_grace() -> None:
    proc = StandIn(dies_on=signal.SIGTERM)
    result = run_ladder(proc, 0, None, LadderConfig(grace=1.0, dump_stacks=False))
    assert (result.outcome, result.signals) == ("killed", ["SIGCONT", "SIGTERM"])
    assert result.dead_at is not None


def test_escalates_to_sigkill() -> None:
    proc = StandIn(dies_on=signal.SIGKILL)
    result = run_ladder(proc, 0, None, LadderConfig(grace=0.01, dump_stacks=False))
    assert (result.outcome, result.signals) == ("killed", ["SIGCONT", "SIGTERM", "SIGKILL"])


def test_reports_an_unkillable_worker_instead_of_waiting_forever() -> None:
    proc = StandIn(dies_on=None)
    result = run_ladder(proc, 0, None, LadderConfig(grace=0.0, dump_stacks=False, verify_timeout=0.01))
    assert result.outcome == "unkillable"
    assert result.signals == ["SIGCONT", "SIGTERM", "SIGKILL"]
    assert "after SIGKILL" in result.detail


def test_an_already_dead_worker_is_never_signalled() -> None:
    proc = StandIn(dies_on=None, gone=True)
    result = run_ladder(proc, signal.SIGRTMIN + 6, "/nonexistent", LadderConfig())
    assert (result.outcome, result.signals, proc.sent) == ("exited", [], [])


def test_kill_group_signals_only_a_group_the_worker_leads() -> None:
    leader = StandIn(dies_on=signal.SIGKILL, pgid=2**22 + 7)  # its own setsid/setpgid
    result = run_ladder(leader, 0, None, LadderConfig(grace=0.0, dump_stacks=False, kill_group=True))
    assert leader.group_sent == [signal.SIGCONT, signal.SIGTERM, signal.SIGKILL]
    assert "process group" not in result.detail
    member = StandIn(dies_on=signal.SIGKILL, pgid=4242)  # in its launcher's group, beside sibling ranks
    result = run_ladder(member, 0, None, LadderConfig(grace=0.0, dump_stacks=False, kill_group=True))
    assert member.group_sent == []
    assert result.outcome == "killed"
    assert "does not lead its process group (pgid 4242" in result.detail


def test_kill_group_signals_the_group_before_the_worker() -> None:
    # Signalled first, the worker can die and be reaped before its group is signalled (issue 34).
    log: list[tuple[str, int]] = []

    class Logged(StandIn):
        def send(self, sig: int) -> bool:
            log.append(("worker", sig))
            return super().send(sig)

        def send_group(self, sig: int) -> bool:
            log.append(("group", sig))
            return super().send_group(sig)

    leader = Logged(dies_on=signal.SIGKILL, pgid=2**22 + 7)
    run_ladder(leader, 0, None, LadderConfig(grace=0.0, dump_stacks=False, kill_group=True))
    sigs = (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL)
    assert log == [(who, sig) for sig in sigs for who in ("group", "worker")]


def test_a_signal_that_reached_only_the_group_still_counts_as_sent() -> None:
    # The group's SIGTERM killed the worker and its launcher reaped it before its own SIGTERM: not "exited".
    class ReapedByTheGroupSignal(StandIn):
        def send_group(self, sig: int) -> bool:
            if sig == signal.SIGTERM:
                self.dead = True
            return super().send_group(sig)

    leader = ReapedByTheGroupSignal(dies_on=None, pgid=2**22 + 7)
    result = run_ladder(leader, 0, None, LadderConfig(grace=0.0, dump_stacks=False, kill_group=True))
    assert result.outcome == "killed"
    assert result.signals == ["SIGCONT", "SIGTERM", "SIGKILL"]
