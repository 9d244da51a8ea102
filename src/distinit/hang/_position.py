"""Where one rank's main thread is, as it publishes it: :class:`Position`, and :class:`Sampler`, which takes it.

The liveness thread of :func:`distinit.setup` samples the main thread's Python stack once a beat
(``sys._current_frames``: no signal, no tracing, a few microseconds) and classifies it by *where* its frames are,
never by what they are called:

* ``collective``: the innermost frame is in torch's collective API (:data:`COLLECTIVE_FILES`: a collective, or a
  wait on its result in torch's own code); ``op`` is that frame's function (``all_reduce``), ``at`` the call site
  outside torch and distinit (``train.py:88``), ``group`` the process group it was given;
* ``code``: anywhere else; ``at`` is the innermost frame and ``own`` the innermost frame outside the Python
  installation and its libraries (the user's own code), when they differ.

With it go the collectives issued so far per process group (torch's per-group sequence numbers, where this torch
has them), how long the rank has been at this same place with the same counts (``still``: a loop that returns to
the same line issues new collectives, so its counts move), and the median time between collectives seen here
(``gap``, once :data:`GAPS_KNOWN` are known): the verdict's threshold grows with a slow loop.

A position is JSON of at most :data:`MAX_BYTES`, parsed defensively: any client of the store can write the key.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Literal, TypeGuard

#: A position's largest encoding (bytes); anything longer on the store is not a position.
MAX_BYTES = 4096
#: Gaps between collectives seen before their median counts (see :class:`Sampler`).
GAPS_KNOWN = 5
#: How many frames up from the innermost are looked at.
MAX_DEPTH = 200

#: The files of torch.distributed whose frames are a collective call or a wait on one (torch's collective API and
#: its wrappers); elsewhere in torch.distributed (FSDP, checkpointing, elastic) a rank is doing work, not waiting.
COLLECTIVE_FILES = frozenset(
    {"distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py", "_functional_collectives_impl.py"}
)
_MISSING = object()

#: ``own`` of a stack with no frame of the user's own code (a script installed as a library, an interpreter hook).
NO_OWN = "-"

Kind = Literal["collective", "code"]


@dataclass(frozen=True)
class Position:
    """One rank's main thread, as sampled: what :func:`distinit.hang.judge` compares across ranks."""

    kind: Kind
    op: str  # collective: the torch.distributed function; code: the innermost function
    at: str  # collective: the call site outside torch and distinit; code: the innermost frame (file:line)
    own: str = ""  # "": ``at`` is the user's own code; else its innermost own frame "fn at file:line", or NO_OWN
    counts: Mapping[str, int] = field(default_factory=dict)  # collectives issued, per group ("world": default)
    still: float = 0.0  # seconds at this place with these counts, as the rank measured it
    gap: float | None = None  # median seconds between collectives seen here (None: not known yet)
    group: str | None = None  # collective: the group of the call ("world": the default group), when known
    beat: int = 0  # the publishing rank's beat number: a position whose beat does not move is stale

    def encode(self) -> str:
        """Compact JSON, at most :data:`MAX_BYTES` (long names are cut)."""
        record = {
            "s": round(self.still, 1),  # first two: the judge reads them without parsing (:func:`still_of`)
            "b": self.beat,
            "k": self.kind,
            "op": _printable(self.op[:80]),
            "at": _printable(self.at[:200]),
            "own": _printable(self.own[:200]),
            "n": dict(list(self.counts.items())[:16]),
            "g": None if self.gap is None else round(self.gap, 2),
            "grp": None if self.group is None else _printable(self.group[:80]),
        }
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def parse(cls, value: bytes | str) -> Position | None:
        """The position ``value`` encodes, or None for anything else (too long, not JSON, wrong types)."""
        record = json_object(value, MAX_BYTES)
        if record is None:
            return None
        kind, op, at, own = record.get("k"), record.get("op"), record.get("at"), record.get("own", "")
        counts, still, gap = record.get("n", {}), record.get("s"), record.get("g")
        if kind not in ("collective", "code") or not (isinstance(op, str) and isinstance(at, str)):
            return None
        if not isinstance(own, str):
            return None
        if not isinstance(counts, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in counts.items()
        ):
            return None
        group, beat = record.get("grp"), record.get("b", 0)
        if not (group is None or isinstance(group, str)) or type(beat) is not int or beat < 0:
            return None
        if not _seconds(still):
            return None
        if gap is None:
            return cls(kind, op, at, own, counts, float(still), None, group, beat)
        return cls(kind, op, at, own, counts, float(still), float(gap), group, beat) if _seconds(gap) else None

    def place(self) -> str:
        """Where it is, in words: ``all_reduce at train.py:88``, or ``load_batch at data.py:41 (its own code)``."""
        if self.kind == "collective":
            return f"{self.op} at {self.at}"
        if not self.own:
            return f"{self.op} at {self.at} (its own code)"
        if self.own == NO_OWN:
            return f"{self.op} at {self.at} (no frame of its own code)"
        return f"{self.op} at {self.at}, called from {self.own} (its own code)"


def json_object(value: bytes | str, limit: int) -> dict[str, object] | None:
    """``value`` as a JSON object, or None: longer than ``limit``, not JSON, too deep, or not an object.

    How every value read from the store is first checked (any client of the store can write it).
    """
    if len(value) > limit:
        return None
    try:
        record = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _printable(text: str) -> str:
    """``text`` with each character that does not print (a tab or newline in a file name) as ``?``."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def still_of(value: bytes) -> float:
    """A published position's ``still`` read from its first field, without parsing the rest (0.0 if unreadable).

    The judge's cheap first look at every rank each beat: no verdict is possible while no rank has stayed put
    for the threshold, so the positions are parsed only when one has.
    """
    if not value.startswith(b'{"s":'):
        return 0.0
    end = value.find(b",", 5, 40)
    try:
        still = float(value[5:end]) if end > 0 else 0.0
    except ValueError:
        return 0.0
    return still if 0.0 <= still < 1e9 else 0.0


def beat_of(value: bytes) -> int | None:
    """A published position's beat number, read from its second field without parsing the rest (None: unreadable)."""
    start = value.find(b',"b":', 5, 48)
    if start < 0:
        return None
    end = value.find(b",", start + 5, start + 30)
    digits = value[start + 5 : end] if end > 0 else b""
    return int(digits) if digits.isdigit() and len(digits) <= 18 else None


def _seconds(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9


def _dir(path: str) -> str:
    return os.path.realpath(path).rstrip(os.sep) + os.sep


def _library_dirs() -> tuple[str, ...]:
    """The Python installation and its site-packages: frames there are not the user's own code."""
    paths = sysconfig.get_paths()
    found = {_dir(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    found.add(_dir(os.path.dirname(os.__file__)))
    return tuple(sorted(found, key=len, reverse=True))  # the deepest first: site-packages before its stdlib


class Sampler:
    """Samples one thread's stack (the main thread by default) into a :class:`Position`, once per call.

    Not thread-safe: one caller (the liveness thread). ``counts`` reads the collectives issued per group.
    """

    def __init__(
        self,
        counts: Callable[[], dict[str, int]],
        *,
        thread_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        group_name: Callable[[object], str | None] = lambda group: None,
    ) -> None:
        import torch  # the liveness thread runs after setup(): torch is loaded

        self._counts, self._clock, self._group_name = counts, clock, group_name
        self._thread_id = threading.main_thread().ident if thread_id is None else thread_id
        self._torch = _dir(os.path.dirname(torch.__file__))
        self._dist = self._torch + "distributed" + os.sep
        self._ours = _dir(os.path.dirname(os.path.dirname(__file__)))
        self._libraries = _library_dirs()
        self._cwd = _dir(os.getcwd())
        self._last: tuple[object, ...] | None = None
        self._since = 0.0
        self._world: int | None = None
        self._changed: float | None = None
        self._gaps: deque[float] = deque(maxlen=32)
        self._reals: dict[str, str] = {}

    def sample(self, beat: int = 0) -> Position | None:
        """The thread's position now (None: the thread is gone); ``beat``: the caller's beat number, published."""
        frame = sys._current_frames().get(self._thread_id) if self._thread_id is not None else None
        if frame is None:
            return None
        frames: list[tuple[str, int, str]] = []
        current: FrameType | None = frame
        call: FrameType | None = None  # the innermost frame of torch's collective API, where its group is
        while current is not None and len(frames) < MAX_DEPTH:
            code = current.f_code
            frames.append((code.co_filename, current.f_lineno or 0, code.co_name))
            if call is None and os.path.basename(code.co_filename) in COLLECTIVE_FILES:
                call = current
            current = current.f_back
        del frame, current
        counts = self._counts()
        now = self._clock()
        self._note_gap(counts.get("world"), now)
        position = self._classify(frames, counts)
        group = self._group_of(call) if position.kind == "collective" and call is not None else None
        del call
        key = (position.kind, position.op, position.at, frames[0][:2] if frames else None, tuple(counts.items()))
        if key != self._last:
            self._last, self._since = key, now
        gap = statistics.median(self._gaps) if len(self._gaps) >= GAPS_KNOWN else None
        return Position(
            position.kind, position.op, position.at, position.own, counts, now - self._since, gap, group, beat
        )

    def _group_of(self, call: FrameType) -> str | None:
        """The process group a collective call was given (its ``group`` argument; None there: the default group).

        Read from the blocked frame's locals: the frame waits in a C call, so its locals do not change meanwhile.
        None when they cannot be read or the group has no name here.
        """
        try:
            locals_ = call.f_locals
            group = locals_.get("group") if "group" in locals_ else locals_.get("pg", _MISSING)
        except Exception:  # a frame whose locals cannot be read: the group stays unknown
            return None
        if group is _MISSING:
            return None
        return self._group_name(group)

    def _note_gap(self, world: int | None, now: float) -> None:
        """The default group's count moved: the time since it last moved, as seen here, is one gap."""
        if world is None or world == self._world:
            return
        if self._world is not None and self._changed is not None:
            self._gaps.append(now - self._changed)
        self._world, self._changed = world, now

    def _classify(self, frames: list[tuple[str, int, str]], counts: dict[str, int]) -> Position:
        if not frames:
            return Position("code", "?", "?", counts=counts)
        inner_file, _, inner_name = frames[0]
        own = next((f for f in frames if self._own(f[0])), None)
        real = self._real(inner_file)
        if real.startswith(self._dist) and os.path.basename(real) in COLLECTIVE_FILES:
            site = next((f for f in frames if not self._inside(f[0])), None)
            at = self._site(site) if site is not None else self._site(frames[0])
            return Position("collective", inner_name, at, counts=counts)
        at = self._site(frames[0])
        if own == frames[0]:
            return Position("code", inner_name, at, counts=counts)
        if own is None:
            return Position("code", inner_name, at, own=NO_OWN, counts=counts)
        return Position("code", inner_name, at, own=f"{own[2]} at {self._site(own)}", counts=counts)

    def _real(self, path: str) -> str:
        """``path`` resolved (cached: a stack's files are few and resolving them costs system calls)."""
        real = self._reals.get(path)
        if real is None:
            real = os.path.realpath(path) if path and not path.startswith("<") else path
            if len(self._reals) < 4096:
                self._reals[path] = real
        return real

    def _inside(self, path: str) -> bool:
        """A frame of torch's or distinit's (not the caller's site)."""
        real = self._real(path)
        return real.startswith(self._torch) or real.startswith(self._ours)

    def _own(self, path: str) -> bool:
        """A frame of the user's own code: a real file outside the Python installation, its libraries and distinit."""
        if not path or path.startswith("<"):
            return False
        real = self._real(path)
        return not (real.startswith(self._ours) or any(real.startswith(d) for d in self._libraries))

    def _site(self, frame: tuple[str, int, str]) -> str:
        """``file:line``: relative to the working directory or a library directory, else the file's base name."""
        path, line, _ = frame
        real = self._real(path)
        for base in (*self._libraries, self._cwd):
            if real.startswith(base):
                return f"{real[len(base) :]}:{line}"
        return f"{os.path.basename(path)}:{line}"
