"""Culprit or victim: judge workers that expired together from their stack dumps and region entry times.

A rank hung in its own code inside a guarded step makes every healthy rank block in ``backward()`` or a
collective inside the same guarded region, so all of them overrun at about the same moment. Killing them
in deadline order names an innocent rank first. Here each expired worker's dump (faulthandler text) is read
for the thread that armed the region: if its innermost Python frame *is in a file of* torch.distributed, DDP
or the autograd engine, or a native frame of the dump (Python 3.14's C stack) *is in* a collective library
(NCCL, RCCL, gloo, MPI, UCC, or c10d inside libtorch), the worker is *waiting* on its peers; otherwise it is
running its own code. Only where a frame is counts, never what its function is called: user code named
``nccl_allreduce_wait`` spinning in Python is the user's code. The workers running their own code are the
culprits, the earliest to enter the region first; the waiting ones are victims. A worker whose claimed ranks
contradict its environment (``Member.mismatch``) keeps its role; the verdict notes it. Pure functions: no
process is touched here.
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
# A native frame of Python 3.14's faulthandler C stack: `Binary file "/path/libnccl.so.2", at sym+0x1a [0x...]`.
_NATIVE_FRAME = re.compile(r'^\s*Binary file "(?P<file>[^"\n]*)", at (?P<sym>[^\s\[]*)', re.MULTILINE)
# Innermost Python frames that mean "waiting on the other ranks", by the *file* they are in: a
# torch.distributed call (all_reduce, barrier, Work.wait wrappers, c10d_logger), DDP's forward/backward
# hooks, the autograd engine (DDP's reducer waits for its all-reduces inside backward), a CUDA synchronize
# behind an NCCL kernel. Anchored on a path component, so ``mytorch/distributed/x.py`` does not match.
_WAITING_FILE = re.compile(r"(?:^|/)torch/(?:distributed|autograd|nn/parallel|cuda)/")
# Native libraries whose frames are a collective wherever the call came from.
_COLLECTIVE_LIBRARY = re.compile(r"^lib(?:nccl|rccl|gloo|mpi|ucc|ucp|uct)[^/]*\.so", re.IGNORECASE)
# torch's own libraries hold c10d and much else: there a frame is a collective when its symbol is c10d's.
_TORCH_LIBRARY = re.compile(r"^lib(?:torch|c10)[^/]*\.so")
_C10D_SYMBOL = re.compile(r"c10d|gloo|nccl|ProcessGroup", re.IGNORECASE)
# How many innermost native frames are looked at (the wait sits at the top: futex, poll, the library).
_NATIVE_DEPTH = 12


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
    mismatch: str = ""  # its claimed ranks vs its environment (Identity.disagreement); "" when they agree
    no_stack: str = ""  # why its dump could not be read ("" when it could, or the reason is unknown)

    def unreadable(self) -> str:
        """``no readable stack``, and why when known."""
        return f"no readable stack: {self.no_stack}" if self.no_stack else "no readable stack"

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
    if _WAITING_FILE.search(path.replace("\\", "/")):
        return Finding("collective", where)
    native = _native_collective(stack or "")
    if native:
        return Finding("collective", f"{native} (native), called from {where}")
    return Finding("own_code", where)


def assess(
    pid: int,
    identity: Identity,
    *,
    armed_at: float,
    stack: str | None,
    thread: int | None,
    no_stack: str = "",
    mismatch: str = "",
) -> Member:
    """One member of a group that expired together, judged from its dump (``stack``; None: none was read).

    ``thread`` is the thread that armed the region (None: not known, as for a FileTimer request: a dump of a
    single thread is then read, one of several is not). ``no_stack`` says why there is no dump, when known.
    """
    finding = classify(stack, thread or 0)
    if finding.activity != "unknown":
        no_stack = ""
    elif not no_stack and stack:
        no_stack = (
            f"the dump shows no frames of thread {thread:#x}, which armed the region"
            if thread
            else "the dump shows several threads and nothing says which one armed the region"
        )
    return Member(pid=pid, identity=identity, armed_at=armed_at, finding=finding, mismatch=mismatch, no_stack=no_stack)


def _native_collective(stack: str) -> str:
    """The innermost native frame of the dump that is in a collective library, or ``""``.

    Native frames come only in dumps that carry a C stack (Python 3.14's faulthandler), which holds the
    dumping thread's frames: the one that armed the region when it is the one blocked.
    """
    for match in list(_NATIVE_FRAME.finditer(stack))[:_NATIVE_DEPTH]:
        library = match["file"].replace("\\", "/").rsplit("/", 1)[-1]
        if _COLLECTIVE_LIBRARY.match(library) or (_TORCH_LIBRARY.match(library) and _C10D_SYMBOL.search(match["sym"])):
            return f"{library} {match['sym']}".rstrip()
    return ""


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
    notes = "".join(f"; rank check: {m.mismatch}" for m in by_entry if m.mismatch)
    if not suspects or not victims:
        return Verdict((), tuple(by_entry), _summary_without_culprit(by_entry, suspects) + notes)
    return Verdict(tuple(suspects), tuple(victims), _summary(suspects, victims, hold) + notes)


def _ranks(members: Sequence[Member]) -> str:
    return ", ".join(m.label() for m in members)


def _summary(culprits: Sequence[Member], victims: Sequence[Member], hold: float) -> str:
    first = culprits[0]
    if first.finding.activity == "own_code":
        doing = f"running its own code at {first.finding.where}"
    else:
        doing = f"with {first.unreadable()}"
    lead = min(v.armed_at for v in victims) - first.armed_at
    entered = f"entered its region {abs(lead):.3f} s {'before' if lead >= 0 else 'after'} the first victim"
    others = f" (other suspects: {_ranks(culprits[1:])})" if len(culprits) > 1 else ""
    waiting = [v for v in victims if v.finding.activity == "collective"]
    unread = [v for v in victims if v.finding.activity != "collective"]  # never says "blocked" without a stack
    seen = [f"{_ranks(waiting)} blocked in a collective ({waiting[0].finding.where})"] if waiting else []
    seen += [f"{_ranks(unread)} with no readable stack"] if unread else []
    return (
        f"watchdog: {len(culprits) + len(victims)} workers expired together; likely culprit "
        f"{first.label()}, {doing}, {entered}{others}; victims {' and '.join(seen)}; killing the culprit "
        f"first, the victims after a {hold:g} s hold"
    )


def _summary_without_culprit(members: Sequence[Member], suspects: Sequence[Member]) -> str:
    if suspects and all(m.finding.activity == "unknown" for m in members):  # no evidence either way
        reasons = "; ".join(sorted({m.no_stack or "reason unknown" for m in members}))
        return (
            f"watchdog: {len(members)} workers expired together, none with a readable stack ({reasons}): "
            f"{_ranks(members)}; who waits on whom is unknown, so no single culprit is named; killing all now"
        )
    if suspects:  # every member runs its own code: independent hangs
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
