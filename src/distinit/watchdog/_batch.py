"""Workers of one job that expire together: wait for the batch, dump every stack, judge, kill the culprit first.

Runs in its own thread, started by the enforcer. The batch waits until the last member's deadline (at most
``group_window`` after the first expiry), drops members that left their region meanwhile, asks every
remaining one for its stack at once, and judges them (:mod:`~distinit.watchdog._culprit`). The culprits are
killed first, in parallel; after ``victim_hold`` seconds the victims still in their region are killed too
(those the culprit's death unblocked, or that their launcher stopped, are not).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from distinit.watchdog._culprit import Member, Verdict, assess, judge
from distinit.watchdog._events import Role, WatchdogEvent
from distinit.watchdog._ladder import LadderConfig, LadderResult, begin_dump, take_dumps
from distinit.watchdog._worker import Worker, dump_signal, first_expired, region_info, stack_file

logger = logging.getLogger("distinit.watchdog")

T = TypeVar("T")
Region = tuple[float, float, str, int]  # (deadline, armed_at, scope, thread), as TableReader.slot_info
# After the last member's deadline, let the server's clock pass it before re-reading the tables.
_SETTLE = 0.005


class Host(Protocol):
    """What a batch needs from the enforcer that started it."""

    path: str
    ladder: LadderConfig

    def finish(
        self,
        w: Worker,
        info: Region,
        *,
        detected: float,
        dumped: LadderResult | None = None,
        role: Role | None = None,
        note: str = "",
        slot: int | None = None,
    ) -> None: ...

    def release(self, w: Worker) -> None: ...

    def report(self, ev: WatchdogEvent) -> None: ...


class _Expired:
    """One member whose region did expire: its worker, slot, region, when the server saw it, and its dump."""

    def __init__(self, w: Worker, slot: int, info: Region, detected: float) -> None:
        self.w, self.slot, self.info, self.detected = w, slot, info, detected
        self.dumped = LadderResult(outcome="exited")


def gather(
    due: Sequence[T],
    ahead: Sequence[T],
    until: float,
    *,
    world: Callable[[T], int | None],
    deadline: Callable[[T], float],
) -> list[list[T]]:
    """Batches to enforce: each expired worker alone, unless others of its job expire by ``until``.

    Workers of one job (the same ``world`` size) that expired (``due``), or whose nearest ``deadline`` falls
    by ``until`` (``ahead``), form one batch, judged together. A lone expired worker is a batch of one:
    killed at once. Members are the enforcer's (worker, slot, deadline) or the FileTimer server's pids.
    """
    jobs: dict[int | None, list[T]] = {}
    for member in due:
        jobs.setdefault(world(member), []).append(member)
    batches = []
    for size, members in jobs.items():
        near = [m for m in ahead if world(m) == size and deadline(m) <= until]
        batches.append(members + near)
    return batches


def run_batch(host: Host, batch: Sequence[tuple[Worker, int | None, float]], detected: float) -> None:
    """Enforce ``batch`` ((worker, expired slot or None, deadline) each); every member is handed back once."""
    pending = {w.key: w for w, _, _ in batch}
    try:
        _run(host, batch, detected, pending)
    except Exception:
        logger.exception(
            "watchdog: judging %d workers that expired together failed; they are watched again",
            len(batch),
            extra={"distinit": {"event": "watchdog.ladder_failed", "pids": [w.ref.pid for w, _, _ in batch]}},
        )
        for w in pending.values():
            host.release(w)


def _run(
    host: Host,
    batch: Sequence[tuple[Worker, int | None, float]],
    detected: float,
    pending: dict[tuple[int, int], Worker],
) -> None:
    cfg = host.ladder
    latest = max(deadline for _, _, deadline in batch)
    time.sleep(max(0.0, min(latest - time.monotonic(), cfg.group_window)) + _SETTLE)
    now = time.monotonic()
    expired = []
    for w, due, _ in batch:
        try:
            slot, _ = first_expired(w.table, now)
        except (OSError, ValueError):
            slot = None  # the server's next check reports the damaged table
        if slot is None:  # it left its region in time: healthy, not part of this
            host.release(pending.pop(w.key))
        else:  # the first member was seen expired at ``detected``, the others only now
            expired.append(_Expired(w, slot, region_info(w, slot, now), detected if due is not None else now))
    if len(expired) <= 1:  # nobody else expired with it: the lone path, no judgement
        for one in expired:
            pending.pop(one.w.key)
            host.finish(one.w, one.info, detected=one.detected, slot=one.slot)
        return
    _dump_all(cfg, expired)
    members = [
        assess(
            e.w.ref.pid,
            e.w.identity,
            armed_at=e.info[1],
            stack=e.dumped.stack,
            thread=e.info[3],
            no_stack=e.dumped.no_stack,
            mismatch=e.w.mismatch,
        )
        for e in expired
    ]
    verdict = judge(members, hold=cfg.victim_hold)
    host.report(verdict_event(host.path, verdict, scope=expired[0].info[2]))
    by_pid = {e.w.ref.pid: e for e in expired}
    first = [by_pid[m.pid] for m in verdict.culprits]
    rest = [by_pid[m.pid] for m in verdict.victims]
    _kill(host, first, verdict, pending)
    if first and rest:
        time.sleep(cfg.victim_hold)
    _kill(host, rest, verdict, pending)


def _dump_all(cfg: LadderConfig, expired: list[_Expired]) -> None:
    """Ask every member for its stack before reading any: they dump in parallel, and are waited for together."""
    asked = []
    for e in expired:
        e.dumped, request = begin_dump(e.w.ref, dump_signal(e.w), stack_file(e.w), cfg)
        if request is not None:
            asked.append((e.dumped, request))
    take_dumps(asked, cfg)


def verdict_event(path: str, verdict: Verdict, *, scope: str) -> WatchdogEvent:
    """The ``watchdog.verdict`` event: the likely culprit (pid, ranks; None when none was found) and the summary."""
    likely = verdict.likely
    judged = likely or (verdict.culprits + verdict.victims)[0]
    return WatchdogEvent(
        event="watchdog.verdict",
        path=path,
        pid=None if likely is None else likely.pid,
        rank=None if likely is None else likely.identity.rank,
        local_rank=None if likely is None else likely.identity.local_rank,
        world_size=judged.identity.world_size,
        role=None if likely is None else "culprit",
        scope=scope,
        detail=verdict.summary,
    )


def role_and_note(verdict: Verdict, member: Member, hold: float) -> tuple[Role | None, str]:
    """The member's role (None: unknown), and what was decided for it (the start of its event's detail)."""
    where = member.finding.where or member.unreadable()
    waiting = member.finding.activity == "collective"
    if member in verdict.culprits:
        return "culprit", f"culprit, running its own code ({where}); killed first:"
    if verdict.culprits:
        doing = "blocked in a collective" if waiting else "stack unreadable"
        return "victim", f"victim, {doing} ({where}); after the culprit and a {hold:g} s hold:"
    if waiting:
        return "victim", f"victim, blocked in a collective ({where}); no culprit among them, killed with the others:"
    if member.finding.activity == "unknown":  # no evidence: neither culprit nor victim is named
        return None, f"role unknown ({where}); no culprit named, killed with the others:"
    return "culprit", f"independent hang ({where}); killed with the others:"


def _kill(
    host: Host,
    group: list[_Expired],
    verdict: Verdict,
    pending: dict[tuple[int, int], Worker],
) -> None:
    """Run the ladders of ``group`` in parallel and wait for them (each ladder bounds itself)."""
    members = {m.pid: m for m in (*verdict.culprits, *verdict.victims)}
    threads = []
    for e in group:
        pending.pop(e.w.key)
        role, note = role_and_note(verdict, members[e.w.ref.pid], host.ladder.victim_hold)
        t = threading.Thread(
            target=host.finish,
            args=(e.w, e.info),
            kwargs={"detected": e.detected, "dumped": e.dumped, "role": role, "note": note, "slot": e.slot},
            name=f"distinit-watchdog-kill-{e.w.ref.pid}",
            daemon=True,
        )
        t.start()
        threads.append(t)
    cfg = host.ladder
    for t in threads:
        t.join(cfg.dump_timeout + cfg.grace + cfg.verify_timeout + 1.0)
