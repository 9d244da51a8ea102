"""The hang verdict itself: a pure function of what every rank published (:func:`judge`).

Inputs, one :class:`RankState` per rank: its :class:`~._position.Position` (where its main thread is, how long
it has been there, the collectives it issued), how long its beat has been silent as the judge saw it, and, on
the judge's host, what the kernel says of its process. The rules:

1. **Waiting ranks**: in a ``torch.distributed`` frame at the same place for ``threshold`` s or more. Ranks in
   the same call at the same site for less join them (they arrived later).
2. No waiting rank: no verdict, except the asynchronous case (NCCL, or ``async_op=True``), where the main
   thread waits in its own code (``.item()``, ``synchronize()``): when every beating rank has stayed put for
   ``threshold`` s and the default group's collective counts differ, the ranks that issued fewer are behind.
3. Every other rank is a fact: silent (its beat stopped: stopped, holding the GIL, gone or cut off), in its own
   code, or in a different collective. A rank elsewhere that has already issued as many collectives as the
   waiting ranks (an asynchronous op) is not a suspect: the collective does not wait for it.
4. The suspects are the likely culprits. With none, and once every rank has itself waited ``threshold`` s
   (before that, a rank that just arrived may complete the call), the ranks in different calls are a
   **mismatch** (a desync: both call sites named), and every rank in the same call is **stuck** (none is
   missing: a slow or stalled transport), said as such and never a reason to stop the job.

Collective numbers (``#5``) are quoted only when they identify the call: the ranks use the default group
alone, and the waiting ranks agree on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from distinit.hang._position import Position

#: The threshold when neither ``hang_after`` nor a step time says otherwise (seconds).
DEFAULT_HANG_AFTER = 10.0
#: At most this many suspects and mismatching calls are spelled out; the rest are counted.
SPELLED = 8

VerdictKind = Literal["culprit", "mismatch", "stuck", "unknown"]


@dataclass(frozen=True)
class RankState:
    """One rank as the judge sees it."""

    rank: int
    who: str  # "rank 2 (host b, pid 4242)"
    position: Position | None
    silent_for: float = 0.0  # its beat unchanged for this long, as the judge saw it
    #: "left" (teardown()); "nopos" (it beats, but its position is not fresh); on the judge's host "stopped",
    #: "disk", "running", "gone"; "": not known
    process: str = ""


@dataclass(frozen=True)
class HangVerdict:
    """What :func:`judge` found: one line, the same on every rank, and the ranks it is about."""

    kind: VerdictKind
    text: str
    waiting: tuple[int, ...]
    culprits: tuple[int, ...]
    key: str  # the same hang judged again gives the same key (a new verdict only when this changes)

    @property
    def stops_the_job(self) -> bool:
        """Whether ``on_hang="abort"`` acts on it: a named culprit or a mismatch, never "stuck" or "unknown"."""
        return self.kind in ("culprit", "mismatch")


def threshold(hang_after: float | None, positions: Iterable[Position | None]) -> float:
    """``hang_after`` when given, else :data:`DEFAULT_HANG_AFTER` or twice the slowest rank's median gap."""
    if hang_after is not None:
        return hang_after
    gaps = [p.gap for p in positions if p is not None and p.gap is not None]
    return max(DEFAULT_HANG_AFTER, 2 * max(gaps)) if gaps else DEFAULT_HANG_AFTER


def judge(states: Sequence[RankState], *, threshold: float, silent_after: float) -> HangVerdict | None:
    """The verdict on ``states`` (one per rank), or None when no rank has waited ``threshold`` s in a collective."""
    fresh = {
        s.rank: s.position
        for s in states
        if s.position is not None and s.silent_for < silent_after and s.process not in ("left", "nopos")
    }
    waiting = [r for r, p in fresh.items() if p.kind == "collective" and p.still >= threshold]
    if not waiting:
        return _asynchronous(states, fresh, threshold=threshold, silent_after=silent_after)
    calls = {(fresh[r].op, fresh[r].at) for r in waiting}
    waiting = _waiters(states, fresh, calls)
    waits = set(waiting)
    seen_waiting = [fresh[r] for r in waiting if r in fresh]
    group = _group(seen_waiting)
    number = _number(seen_waiting, group)
    suspects: list[RankState] = []
    elsewhere: list[RankState] = []  # in another collective
    unknown: list[RankState] = []  # nothing says where they are, or whether the call waits for them
    facts: list[str] = []
    for state in (s for s in states if s.rank not in waits):
        position = fresh.get(state.rank)
        member = _member(state.position, group)
        if position is not None and position.kind == "collective":
            elsewhere.append(state)
            there = f"{position.op}{_num(_number([position], group))} at {position.at}"
            facts.append(f"{state.who} has waited {position.still:.0f} s in {there}")
        elif member is False:
            facts.append(f"{state.who} is not in that call's group (not waited for)")
        elif position is not None and number is not None and position.counts.get(group or "", -1) >= number:
            facts.append(f"{state.who} has issued #{number} and is in {position.place()} (not waited for)")
        elif state.process == "left" or (state.silent_for >= silent_after and state.process != "nopos"):
            suspects.append(state)
            facts.append(_fact(state, silent_after))
        elif position is None or group is None:
            unknown.append(state)
            facts.append(_unknown_fact(state, position, silent_after))
        else:
            suspects.append(state)
            facts.append(_fact(state, silent_after))
    if not suspects and any(fresh[r].still < threshold for r in [*waiting, *(s.rank for s in elsewhere)] if r in fresh):
        # every rank is in a collective and some only just arrived: the call may complete now, or the late ones
        # are in a different call and will have waited long enough within a beat or two (then: a mismatch)
        return None
    head = _waiting_text(waiting, fresh, number)
    culprits = tuple(s.rank for s in suspects)
    ops = sorted({fresh[r].op for r in waiting if r in fresh} | {fresh[s.rank].op for s in elsewhere})
    kind, tail = _conclusion(culprits, mismatch=len(calls) > 1 or bool(elsewhere), unknown=bool(unknown))
    text = f"hang: {head}" + (f"; {'; '.join(_spelled(facts))}" if facts else "") + f" — {tail}"
    key = f"{kind}|{','.join(map(str, culprits))}|{number}|{'/'.join(ops)}"
    return HangVerdict(kind, text, tuple(waiting), culprits, key)


def _waiters(states: Sequence[RankState], fresh: dict[int, Position], calls: set[tuple[str, str]]) -> list[int]:
    """Every rank in one of the waiting ``calls``, besides those that waited the threshold.

    A rank there for less time arrived later; one silent since it was seen there has a starved liveness thread,
    and is no culprit.
    """
    return sorted(
        s.rank
        for s in states
        if s.process != "left"
        and (position := fresh.get(s.rank, s.position)) is not None
        and position.kind == "collective"
        and (position.op, position.at) in calls
    )


def _conclusion(culprits: Sequence[int], *, mismatch: bool = False, unknown: bool = False) -> tuple[VerdictKind, str]:
    """The verdict's kind and its last words: the culprits, else a mismatch, else unknown, else stuck."""
    if culprits:
        named = _ranks(list(culprits))
        return "culprit", f"{named} is the likely culprit" if len(culprits) == 1 else f"{named} are the likely culprits"
    if mismatch:
        return "mismatch", "the ranks called different collectives (a desync); no rank is missing"
    if unknown:
        return (
            "unknown",
            "no culprit can be named: where those ranks are, or whether the call waits for them, is not known",
        )
    return "stuck", (
        "none is missing: the collective itself has not completed (a large or slow transfer, or a stalled network or "
        "backend); no culprit"
    )


def _asynchronous(
    states: Sequence[RankState], fresh: dict[int, Position], *, threshold: float, silent_after: float
) -> HangVerdict | None:
    """No rank waits inside torch: every rank stayed put and the default group's counts differ (NCCL's case).

    Named only with the default group alone and exactly two counts among the ranks: then the ranks that issued
    fewer are behind, unless they wait at the same place as the ranks ahead (point-to-point ops also count, so
    counts may differ between ranks that wait alike).
    """
    beating = [s for s in states if s.silent_for < silent_after and s.process not in ("left", "nopos")]
    if len(beating) != len(states) or any(s.rank not in fresh or fresh[s.rank].still < threshold for s in beating):
        return None
    if any(set(p.counts) != {"world"} for p in fresh.values()):
        return None
    counts = {r: p.counts["world"] for r, p in fresh.items()}
    if len(set(counts.values())) != 2:
        return None
    top = max(counts.values())
    ahead = sorted(r for r, c in counts.items() if c == top)
    places = {(fresh[r].op, fresh[r].at) for r in ahead}
    behind = [s for s in states if s.rank not in set(ahead)]
    if any((fresh[s.rank].op, fresh[s.rank].at) in places for s in behind):
        return None  # a rank behind waits where the ranks ahead wait: the counts do not tell who is missing
    facts = [
        f"{s.who} has issued #{fresh[s.rank].counts['world']} only and is in {fresh[s.rank].place()}" for s in behind
    ]
    wait = min(fresh[r].still for r in ahead)
    where = sorted(fresh[r].place() for r in ahead)
    head = (
        f"{_ranks(ahead)} issued collective #{top} and have waited {wait:.0f} s since, in "
        f"{' or '.join(sorted(set(where))[:3])} (an asynchronous collective's result)"
    )
    culprits = tuple(s.rank for s in behind)
    text = f"hang: {head}; {'; '.join(_spelled(facts))} — {_conclusion(culprits)[1]}"
    return HangVerdict("culprit", text, tuple(ahead), culprits, f"culprit|{','.join(map(str, culprits))}|{top}|async")


def _fact(state: RankState, silent_after: float) -> str:
    """What is known of a suspect: it left, it is silent (and what its process does), or where it is."""
    if state.process == "left":
        return f"{state.who} left through teardown() (it issued fewer collectives, or ended early)"
    if state.silent_for >= silent_after:
        how = {
            "stopped": "its process is stopped (state T: SIGSTOP, a debugger or job control)",
            "running": "its process runs but its liveness thread cannot (a C call holding the GIL?)",
            "disk": "its process is in uninterruptible sleep (state D: waiting on a filesystem or a device)",
            "gone": "its process is gone",
        }.get(state.process, "frozen, holding the GIL, or cut off from the store")
        return f"{state.who} has not beaten for {state.silent_for:.0f} s: {how}"
    assert state.position is not None  # a suspect that is neither left nor silent has a fresh position
    return f"{state.who} is in {state.position.place()}"


def _unknown_fact(state: RankState, position: Position | None, silent_after: float) -> str:
    if state.process == "nopos" or state.position is None:
        return f"{state.who} publishes no fresh position (its hang verdict is off or failed): unknown where it is"
    assert position is not None
    return f"{state.who} is in {position.place()} (whether the call waits for it is not known: several groups)"


def _group(positions: Sequence[Position]) -> str | None:
    """The group the waiting ranks' call is on: the one they name, or "world" when it is the only group there is."""
    named = {p.group for p in positions}
    if len(named) == 1 and None not in named:
        return named.pop()
    if positions and all(set(p.counts) <= {"world"} for p in positions):
        return "world"
    return None


def _member(position: Position | None, group: str | None) -> bool | None:
    """Whether a rank is in ``group``, by the counts it publishes (one per group it belongs to); None: unknown."""
    if position is None or group is None or not position.counts:
        return None
    return group in position.counts


def _waiting_text(waiting: list[int], fresh: dict[int, Position], number: int | None) -> str:
    by_call: dict[tuple[str, str], list[int]] = {}
    silent: list[int] = []
    for rank in waiting:
        if rank in fresh:
            by_call.setdefault((fresh[rank].op, fresh[rank].at), []).append(rank)
        else:
            silent.append(rank)
    parts = []
    for (op, at), ranks in sorted(by_call.items(), key=lambda item: item[1][0]):
        wait = max(fresh[r].still for r in ranks)
        verb = "has" if len(ranks) == 1 else "have"
        parts.append(f"{_ranks(ranks)} {verb} waited {wait:.0f} s in {op}{_num(number)} at {at}")
    if silent:
        parts.append(f"{_ranks(silent)} last seen waiting there too, silent since (a starved or frozen watch)")
    return "; ".join(_spelled(parts))


def _number(positions: Sequence[Position], group: str | None = "world") -> int | None:
    """The call's number in ``group``, when every rank given agrees on it (None: unknown or not agreed)."""
    if not positions or group is None or any(group not in p.counts for p in positions):
        return None
    numbers = {p.counts[group] for p in positions}
    return numbers.pop() if len(numbers) == 1 else None


def _num(number: int | None) -> str:
    return f" #{number}" if number is not None else ""


def _spelled(parts: list[str]) -> list[str]:
    if len(parts) <= SPELLED:
        return parts
    return [*parts[:SPELLED], f"and {len(parts) - SPELLED} more"]


def _ranks(ranks: list[int]) -> str:
    """``rank 2``, ``ranks 0,1,3``, ``ranks 0-30,32-63``: runs of three or more as ranges."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        runs.append(f"{start}-{prev}" if prev - start >= 2 else ",".join(map(str, range(start, prev + 1))))
        if rank is not None:
            start = prev = rank
    return "ranks " + ",".join(runs)
