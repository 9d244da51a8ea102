"""How often a rank waiting in the join polls and beats: scaled with the world so one store's load stays flat.

Every waiting rank polls the ``state`` key, writes its beat and reads the beat it watches, so a world of N
ranks costs the store about ``N x (1 / poll + 2 / beat)`` operations per second while it waits. At the base
intervals (``poll`` 0.25 s, ``beat`` 1 s) that is 6 operations per rank per second: 6,000/s at 1,000 ranks,
well inside what one TCPStore serves (23k-49k set/check per second measured in ``benchmarks/bench_scale.py``).
Above :data:`SCALE_RANKS` ranks both intervals grow in proportion to the world::

    scale = max(1, N / 1000)
    poll  = 0.25 s x scale            (the longest pause between two polls of the state key)
    beat  = 1 s x scale
    stale = max(5 s, 5 x beat)        (a beat unchanged this long: the rank is lost)

so the waiting load stays at about 6,000 operations per second whatever N (and rank 0's watch reads about
1,000 beats per second). Worlds up to 1,000 ranks keep the base intervals: a joined rank that dies is named
within ``stale + beat`` = 6 s. ``stale`` is five beats rather than five seconds so that a beat thread that is
starved for a few beats (thousands of simulated ranks on a few cores, a host under load) is not declared lost:
what counts is missed beats, not wall time. The price at 10k ranks: a join completes for everyone up to 2.5 s
after the last arrival and a lost rank is named after about 60 s.

The loss bound is also the freeze policy: a joined rank that does not run for longer than ``stale`` (SIGSTOP, a
thread holding the GIL, swap) is declared lost, and when it resumes it raises that verdict about itself. A job
that expects longer pauses during start-up raises the bound with ``DISTINIT_LOSS_BOUND=<seconds>`` (never
below the scaled ``stale``; read by every rank, so set it for the whole job).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from distinit.errors import MalformedEnvError

#: World size up to which the base intervals hold; above it, intervals grow in proportion.
SCALE_RANKS = 1000
#: Base intervals, in seconds: longest pause between polls of the state key; between beats.
POLL = 0.25
BEAT = 1.0
#: A beat unchanged this many seconds (or :data:`STALE_BEATS` beats, whichever is longer) means a lost rank.
STALE = 5.0
STALE_BEATS = 5
#: The first pause of a wait (at the base ``poll``; it scales with ``poll``), doubled at each poll up to
#: ``poll``: a join whose last rank arrives within milliseconds is seen within milliseconds, a long wait
#: settles at ``poll`` after six polls.
FIRST_POLL = 0.005
GROWTH = 2.0


def load_scale(world_size: int) -> float:
    """``max(1, world_size / SCALE_RANKS)``: how many times longer than the base intervals a rank waits."""
    return max(1.0, world_size / SCALE_RANKS)


@dataclass(frozen=True)
class Pace:
    """The waiting intervals of one world, in seconds (see the module docstring for the formula)."""

    poll: float
    beat: float
    stale: float

    @classmethod
    def for_world(cls, world_size: int, *, loss_bound: float | None = None) -> Pace:
        """The intervals for a world of ``world_size`` ranks (``loss_bound``: a longer ``stale``, if given).

        Raises:
            ValueError: ``world_size`` is below 1.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        scale = load_scale(world_size)
        beat = BEAT * scale
        return cls(poll=POLL * scale, beat=beat, stale=max(STALE, STALE_BEATS * beat, loss_bound or 0.0))

    def pauses(self) -> PauseSchedule:
        """A fresh schedule of pauses between polls, growing to :attr:`poll`."""
        return PauseSchedule(self.poll)


class PauseSchedule:
    """Pauses between polls of one wait: ``first`` x :data:`GROWTH` ** n, at most ``longest``.

    ``first`` is ``longest`` x :data:`FIRST_POLL` / :data:`POLL` (5 ms at the base interval): a large world,
    whose joins take longer anyway, does not spend its first second on polls that cannot succeed yet.
    """

    def __init__(self, longest: float) -> None:
        self.longest = longest
        self._next = longest * FIRST_POLL / POLL

    def next(self) -> float:
        """The next pause (each one :data:`GROWTH` times the last, up to ``longest``)."""
        pause = self._next
        self._next = min(pause * GROWTH, self.longest)
        return pause


#: The variable that raises the loss bound (seconds).
LOSS_BOUND_VARIABLE = "DISTINIT_LOSS_BOUND"


def loss_bound(environ: Mapping[str, str]) -> float | None:
    """``DISTINIT_LOSS_BOUND`` in seconds, if set.

    Raises:
        MalformedEnvError: the value is not a positive finite number of seconds.
    """
    text = environ.get(LOSS_BOUND_VARIABLE)
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise MalformedEnvError(
            f"{LOSS_BOUND_VARIABLE}={text!r} is not a positive number of seconds.",
            variables=(LOSS_BOUND_VARIABLE,),
            fix=f"set {LOSS_BOUND_VARIABLE} to the longest pause a joined rank may take, in seconds (e.g. 30), "
            "or unset it.",
        )
    return value
