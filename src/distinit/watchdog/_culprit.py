"""Culprit or victim: judge workers that expired together from their stack dumps and region entry times.

A rank hung in its own code inside a guarded step makes every healthy rank block in ``backward()`` or a
collective inside the same guarded region, so all of them overrun at about the same moment. Killing them
in deadline order names an innocent rank first. Here each expired worker's dump (faulthandler text) is read
for the thread that armed the region: if its innermost frame is torch.distributed, DDP or the autograd
engine (or names c10d, gloo or NCCL), the worker is *waiting* on its peers; otherwise it is running its own
code. The workers running their own code are the culprits, the earliest to enter the region first; the
waiting ones are victims. Pure functions: no process is touched here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from distinit.watchdog._protocol import Identity

#: What an expired worker was doing: waiting on peers, running its own code, or no stack to tell.
Activity = Literal["collective", "own_code", "unknown"]

_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)\b.*$", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"\n]*)", line (?P<line>\d+) in (?P<func>[^\n]*)$', re.MULTILINE)
# Innermost frames that mean "waiting on the other ranks": a torch.distributed call (all_reduce, barrier,
# Work.wait wrappers, c10d_logger), DDP's forward/backward hooks, the autograd engine (DDP's reducer waits
# for its all-reduces inside backward), a CUDA synchronize behind an NCCL kernel.
_WAITING_FILE = re.compile(r"torch/(?:distributed|autograd|nn/parallel|cuda)/")
# Native frame names (Python 3.14's C stacks, py-spy style dumps) of the collective back-ends.
_WAITING_NAME = re.compile(r"c10d|gloo|nccl|ProcessGroup", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    """What one worker's dump says: its activity and the innermost frame it was in (``where``)."""

    activity: Activity
    where: str = ""


@dataclass(frozen=True)
class Member:
    """One worker of a group that expired together."""

    pid: int
    identity: Identity
    armed_at: float  # CLOCK_MONOTONIC: when it entered the expired region
    finding: Finding

    def label(self) -> str:
        """``RANK 2 (pid 4711)``, or ``pid 4711`` when the rank is unknown."""
        rank = self.identity.rank
        return f"pid {self.pid}" if rank is None else f"RANK {rank} (pid {self.pid})"


@dataclass(frozen=True)
class Verdict:
    """Who to kill first: ``culprits`` (earliest entry first), then ``victims`` after the hold."""

    culprits: tuple[Member, ...]
    victims: tuple[Member, ...]
    summary: str

    @property
    def likely(self) -> Member | None:
        """The likely culprit: the culprit that entered its region first (None when none was found)."""
        return self.culprits[0] if self.culprits else None


def thread_frames(stack: str, thread: int) -> list[tuple[str, int, str]] | None:
    """(file, line, function) of ``thread``'s frames in a faulthandler dump, innermost first; None if absent.

    When the dump has a single thread (``all_threads=False``, or one header), that thread is used.
    """
    headers = list(_THREAD_HEADER.finditer(stack))
    sections = [
        (int(h[1], 16), stack[h.end() : headers[i + 1].start() if i + 1 < len(headers) else len(stack)])
        for i, h in enumerate(headers)
    ]
    body = next((text for ident, text in sections if ident == thread), None)
    if body is None:
        if len(sections) > 1:
            return None
        body = sections[0][1] if sections else stack
    return [(m["file"], int(m["line"]), m["func"].strip()) for m in _FRAME.finditer(body)]


def classify(stack: str | None, thread: int) -> Finding:
    """Whether the thread that armed the region (``thread``) waits on its peers or runs its own code."""
    frames = thread_frames(stack, thread) if stack else None
    if not frames:
        return Finding("unknown")
    path, line, func = frames[0]
    where = f"{_short(path)}:{line} in {func}"
    path = path.replace("\\", "/")
    if _WAITING_FILE.search(path) or _WAITING_NAME.search(func) or _WAITING_NAME.search(path.rsplit("/", 1)[-1]):
        return Finding("collective", where)
    return Finding("own_code", where)


def _short(path: str) -> str:
    """The last three components of a path: enough to recognise it in one log line."""
    return "/".join(path.replace("\\", "/").split("/")[-3:])


def judge(members: Sequence[Member], *, hold: float) -> Verdict:
    """Split ``members`` into culprits and victims and write the one-line summary of the decision.

    Culprits are the members running their own code; if none is, those whose dump could not be read (they
    may be the culprit; the waiting ones certainly are not). Culprits are ordered by when they entered their
    region, earliest first. When every member waits in a collective, none is the culprit: the rank they
    wait for is elsewhere (another node, or outside any guarded region), so all are killed at once.
    """
    by_entry = sorted(members, key=lambda m: m.armed_at)
    suspects = [m for m in by_entry if m.finding.activity == "own_code"] or [
        m for m in by_entry if m.finding.activity == "unknown"
    ]
    victims = [m for m in by_entry if m not in suspects]
    if not suspects or not victims:
        return Verdict((), tuple(by_entry), _summary_without_culprit(by_entry, suspects))
    return Verdict(tuple(suspects), tuple(victims), _summary(suspects, victims, hold))


def _ranks(members: Sequence[Member]) -> str:
    return ", ".join(m.label() for m in members)


def _summary(culprits: Sequence[Member], victims: Sequence[Member], hold: float) -> str:
    first = culprits[0]
    doing = "running its own code" if first.finding.activity == "own_code" else "with no readable stack"
    lead = min(v.armed_at for v in victims) - first.armed_at
    entered = f"entered its region {abs(lead):.3f} s {'before' if lead >= 0 else 'after'} the first victim"
    others = f" (other suspects: {_ranks(culprits[1:])})" if len(culprits) > 1 else ""
    waiting = [v for v in victims if v.finding.activity == "collective"]
    wait = f" ({waiting[0].finding.where})" if waiting else ""
    return (
        f"watchdog: {len(culprits) + len(victims)} workers expired together; likely culprit "
        f"{first.label()}, {doing} at {first.finding.where or '?'}, {entered}{others}; victims "
        f"{_ranks(victims)} blocked in a collective{wait}; killing the culprit first, the victims after a "
        f"{hold:g} s hold"
    )


def _summary_without_culprit(members: Sequence[Member], suspects: Sequence[Member]) -> str:
    if suspects:  # every member runs its own code (or none has a stack): independent hangs
        return (
            f"watchdog: {len(members)} workers expired together, none waiting on a collective: "
            f"{_ranks(members)}; no single culprit, killing all now"
        )
    world = members[0].identity.world_size
    seen = {m.identity.rank for m in members}
    missing = sorted(set(range(world)) - seen) if world is not None and None not in seen else []
    elsewhere = f"; ranks not among them: {', '.join(map(str, missing))} (look there)" if missing else ""
    return (
        f"watchdog: {len(members)} workers expired together, all blocked in a collective "
        f"({members[0].finding.where}): {_ranks(members)}; the rank they wait for is not among them "
        f"(another node, or outside a guarded region){elsewhere}; killing all now"
    )
