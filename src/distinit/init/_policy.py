"""The pure policies of a rendezvous: what a failed attempt is, the pause, the grace, the pace.

What a failed attempt is, how long to pause after it, how long one kind of failure may persist, and how often
waiting ranks poll and beat:

* :class:`AttemptFailed` -- an attempt ended without a group for a reason that waiting may cure (its kind);
* :class:`Bounds` -- the time bounds of one call, validated once on entry;
* :class:`Backoff` -- the pause between attempts;
* :class:`Grace` -- how long one kind of failure may persist before it becomes its specific error;
* :class:`Pace` -- the join's poll and beat intervals, scaled with the world (see :data:`SCALE_RANKS`);
* :func:`store_sign` and :func:`judge_store_host` -- whether the store host (rank 0) left, from what the
  probes of its port saw since this rank's store connection failed.

Every policy is pure apart from an injected clock or random source, so tests drive them with fakes.
"""

from __future__ import annotations

import errno
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from torch.distributed import constants as _torch_constants

from distinit._duration import to_seconds, to_timedelta
from distinit._foreign import first_line
from distinit._net import ProbeKind
from distinit.errors import DistinitError, MalformedEnvError

#: torch's default collective timeout (30 min).
default_pg_timeout: timedelta = _torch_constants.default_pg_timeout
#: torch's NCCL default (10 min), named since torch 2.2; None before (torch 2.1's NCCL used
#: ``default_pg_timeout``, 30 min, and torch 2.1 has no ``default_pg_nccl_timeout`` to import).
default_pg_nccl_timeout: timedelta | None = getattr(_torch_constants, "default_pg_nccl_timeout", None)

#: Why an attempt failed in a way that waiting may cure.
FailureKind = Literal[
    "refused",  # nothing listens on MASTER_PORT yet (master not up)
    "dns",  # MASTER_ADDR does not resolve (yet)
    "unreachable",  # no route to MASTER_ADDR
    "timeout",  # connects time out: packets vanish (black hole)
    "foreign",  # a non-TCPStore program listens on MASTER_PORT
    "port_busy",  # rank 0 cannot bind MASTER_PORT
    "store",  # the store connection failed or was lost
    "join",  # not every rank joined within the attempt
    "init",  # torch's init_process_group (or the check collective) failed after a complete join
]


class AttemptFailed(Exception):
    """An attempt ended without a group, for a reason that may go away; never escapes ``init_with_retry``.

    Attributes:
        kind: the failure class (see :data:`FailureKind`).
        detail: one line saying what was seen, with values.
        missing_ranks: ranks not joined when the attempt ended (join failures only).
    """

    def __init__(self, kind: FailureKind, detail: str, *, missing_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: FailureKind = kind
        self.detail = detail
        self.missing_ranks = missing_ranks


#: Whether waiting may cure a foreign error met during an attempt (see :func:`nature`).
Nature = Literal["transient", "deterministic"]
#: Errors that say the call itself cannot work here: the same call fails the same way on every try.
_DETERMINISTIC = (NotImplementedError, TypeError, AttributeError, ImportError, ValueError)
#: OS errors that no retry cures: a privileged port, a forbidden operation.
_DETERMINISTIC_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


def nature(exc: BaseException) -> Nature:
    """Whether ``exc`` (torch, gloo or the OS, met during an attempt) is transient or deterministic. Pure.

    Transient: a refused, reset, timed-out or broken connection, a store error, anything unknown (retried to the
    deadline, as before). Deterministic: a feature this torch lacks (``NotImplementedError``, an unknown keyword's
    ``TypeError``, a missing attribute or module), a value torch rejects (``ValueError``), a forbidden bind; these
    end the call at once. ``NotImplementedError`` is a ``RuntimeError``, so it is tested first. Our own errors
    are not foreign: they are their own verdicts.
    """
    if isinstance(exc, DistinitError):
        return "transient"  # never wrapped: the caller raises or retries it as it is
    if isinstance(exc, _DETERMINISTIC):
        return "deterministic"
    if isinstance(exc, OSError) and exc.errno in _DETERMINISTIC_ERRNOS:
        return "deterministic"
    return "transient"


class Unsupported(Exception):
    """A torch call of an attempt failed in a way no retry cures (:func:`nature`); never escapes ``init_with_retry``.

    The attempt loop turns it into a :class:`~distinit.errors.RendezvousError` at once (and publishes it when
    this rank reached a store). Attributes: ``step`` (what failed, e.g. ``"host the store"``), ``cause``.
    """

    def __init__(self, step: str, cause: Exception) -> None:
        super().__init__(f"cannot {step}: {quote(cause)}")
        self.step = step
        self.cause = cause


def quote(exc: BaseException) -> str:
    """A foreign error (torch, gloo, the OS) as ``Type: first line`` for an attempt's detail."""
    return f"{type(exc).__name__}: {first_line(exc, limit=200)}"


class Backoff(BaseModel):
    """Pause between rendezvous attempts: ``initial * factor**(n-1)``, capped at ``cap``, plus jitter.

    The default (1 s, x2, cap 30 s, up to 1 s of uniform jitter) spreads the retries of many ranks so that
    they do not hammer the store in lock-step, while keeping the last attempt close to the deadline.
    The pause is always clamped to what is left of the deadline by :func:`distinit.init_with_retry`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial: float = Field(default=1.0, gt=0, description="Seconds after the first failed attempt.")
    factor: float = Field(default=2.0, ge=1, le=10, description="Growth per further failed attempt.")
    cap: float = Field(default=30.0, gt=0, description="Largest pause before jitter, in seconds.")
    jitter: float = Field(default=1.0, ge=0, description="Uniform random seconds added to each pause.")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based). Pure apart from ``rng``.

        Raises:
            ValueError: ``attempt`` is smaller than 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt!r}")
        base = min(self.cap, self.initial * self.factor ** min(attempt - 1, 60))
        return base + (rng.uniform(0.0, self.jitter) if self.jitter else 0.0)


@dataclass(frozen=True)
class Bounds:
    """``deadline``, ``attempt_timeout`` and ``pg_timeout`` as float seconds (``inf``: no limit).

    Infinity is accepted for all three and means "no limit"; every native wait clamps it (and any huge
    finite value) with :func:`distinit._duration.wait_bound`, so nothing raises ``OverflowError``.
    """

    deadline: float
    attempt_timeout: float
    pg_timeout: float | None
    #: When the call began (monotonic; 0: when the rendezvous starts): the deadline counts from the call, so
    #: what setup() does before the attempts (resolving the world, imports on first use, waiting for an
    #: abandoned call to wind down) is inside it, not added to it.
    started: float = 0.0

    @classmethod
    def of(cls, *, deadline: object, attempt_timeout: object, pg_timeout: object) -> Bounds:
        """Validate the caller's arguments (seconds or ``timedelta``), now: the deadline counts from here.

        Raises:
            TypeError: a value is not a number of seconds or a ``timedelta`` (``"600"`` and ``True`` included).
            ValueError: a value is NaN, zero or negative.
        """
        return cls(
            deadline=to_seconds(deadline, "deadline", allow_inf=True),
            attempt_timeout=to_seconds(attempt_timeout, "attempt_timeout", allow_inf=True),
            pg_timeout=None if pg_timeout is None else to_seconds(pg_timeout, "pg_timeout", allow_inf=True),
            started=time.monotonic(),
        )

    def init_timeout(self) -> timedelta | None:
        """The ``timeout=`` for ``init_process_group`` when no bootstrap bound of ours applies (None: torch's)."""
        return None if self.pg_timeout is None else to_timedelta(self.pg_timeout)

    def collective_timeout(self, backend: str) -> timedelta:
        """The collective timeout after init: ``pg_timeout``, or torch's default (10 min NCCL, 30 min others)."""
        if self.pg_timeout is not None:
            return to_timedelta(self.pg_timeout)
        if backend == "nccl" and default_pg_nccl_timeout is not None:
            return default_pg_nccl_timeout
        return default_pg_timeout


#: No attempt starts with less than this left of the deadline (seconds).
MIN_ATTEMPT = 0.25


def next_pause(
    attempt: int,
    *,
    deadline_at: float,
    backoff: Backoff,
    rng: random.Random,
    min_attempt: float = MIN_ATTEMPT,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """The pause after failed attempt ``attempt``, or None when the deadline leaves no room for another.

    The deadline is ours (an absolute monotonic time), because a blocking attempt cannot be interrupted from
    outside: each attempt clamps its own bounds to what is left, the pause is clamped so that the next attempt
    starts with at least ``min_attempt`` s left, and no attempt starts with less.
    """
    room = deadline_at - clock() - min_attempt
    if room <= 0:
        return None
    return max(0.0, min(backoff.delay(attempt, rng), room))


# Their public home, set once built (pydantic resolves the annotations in the defining module): reprs and
# pickles never name a private module.
Backoff.__module__ = "distinit.init"


# Some failures cure themselves (a DNS record that appears late, a previous run freeing its port), so the
# rendezvous keeps retrying them; only when one kind of failure has lasted for its whole grace period does
# waiting stop and the specific error (``MasterUnreachableError``, ``PortInUseError``) replace the generic
# timeout. Any other kind seen in between starts the count again.
#: Grace periods in seconds; kinds without one (refused, timeout, store, join, init) are retried to the deadline.
DNS_GRACE = 60.0
UNREACHABLE_GRACE = 10.0
PORT_GRACE = 30.0


@dataclass(frozen=True)
class Persisted:
    """A failure that outlasted its grace period: its kind and how long it lasted, in seconds."""

    kind: FailureKind
    lasted: float


class Grace:
    """Track the current streak of one failure kind and say when it outlasted its grace period.

    Pure apart from its own streak: the caller passes every time (``since``, ``now``), so tests drive it
    with a fake clock. ``foreign`` (a non-TCPStore program on the port) gets ``attempt_timeout``, because a
    real store answers the handshake in milliseconds.
    """

    def __init__(
        self,
        *,
        foreign: float,
        dns: float = DNS_GRACE,
        unreachable: float = UNREACHABLE_GRACE,
        port_busy: float = PORT_GRACE,
    ) -> None:
        self._limits: dict[FailureKind, float] = {
            "dns": dns,
            "unreachable": unreachable,
            "port_busy": port_busy,
            "foreign": foreign,
        }
        self._streak: tuple[FailureKind, float] | None = None

    def observe(self, kind: FailureKind, since: float, now: float) -> Persisted | None:
        """Record that ``kind`` was seen from ``since`` until ``now``; a :class:`Persisted` once past its grace.

        ``since`` matters for the first sight only: a probe that waited 3 s for a handshake saw the failure
        from its start, so the grace counts from there.
        """
        if self._streak is None or self._streak[0] != kind:
            self._streak = (kind, since)
        lasted = now - self._streak[1]
        limit = self._limits.get(kind)
        return Persisted(kind, lasted) if limit is not None and lasted >= limit else None

    def clear(self) -> None:
        """Forget the streak (the master answered as a TCPStore)."""
        self._streak = None


# Every waiting rank polls the ``state`` key, writes its beat and reads the beat it watches, so a world of N
# ranks costs the store about ``N x (1 / poll + 2 / beat)`` operations per second while it waits. At the base
# intervals (``poll`` 0.25 s, ``beat`` 1 s) that is 6 operations per rank per second: 6,000/s at 1,000 ranks,
# well inside what one TCPStore serves (23k-49k set/check per second measured in ``benchmarks/bench_scale.py``).
# Above :data:`SCALE_RANKS` ranks both intervals grow in proportion to the world::
#
#     scale = max(1, N / 1000)
#     poll  = 0.25 s x scale            (the longest pause between two polls of the state key)
#     beat  = 1 s x scale
#     stale = max(5 s, 5 x beat)        (a beat unchanged this long: the rank is lost)
#
# so the waiting load stays at about 6,000 operations per second whatever N (and rank 0's watch reads about
# 1,000 beats per second). Worlds up to 1,000 ranks keep the base intervals: a joined rank that dies is named
# within ``stale + beat`` = 6 s. ``stale`` is five beats rather than five seconds so that a beat thread that is
# starved for a few beats (thousands of simulated ranks on a few cores, a host under load) is not declared lost:
# what counts is missed beats, not wall time. The price at 10k ranks: a join completes for everyone up to 2.5 s
# after the last arrival and a lost rank is named after about 60 s.
#
# The loss bound is also the freeze policy: a joined rank that does not run for longer than ``stale`` (SIGSTOP, a
# thread holding the GIL, swap) is declared lost, and when it resumes it raises that verdict about itself. A job
# that expects longer pauses during start-up raises the bound with ``DISTINIT_LOSS_BOUND=<seconds>`` (never
# below the scaled ``stale``; read by every rank, so set it for the whole job).
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
#: Worlds of up to this many ranks poll :data:`QUICK_POLLS` times at the first pause before it doubles: a join
#: whose last rank arrives 10-40 ms after the first is seen within 5 ms instead of up to 20 ms later (the happy
#: path's median overhead over torch at world 2, issue 27). It adds at most ``QUICK_POLLS`` checks per rank and
#: wait, so larger worlds, whose joins take longer anyway, keep the plain doubling.
QUICK_WORLD = 64
QUICK_POLLS = 8


def load_scale(world_size: int) -> float:
    """``max(1, world_size / SCALE_RANKS)``: how many times longer than the base intervals a rank waits."""
    return max(1.0, world_size / SCALE_RANKS)


@dataclass(frozen=True)
class Pace:
    """The waiting intervals of one world, in seconds (see the module docstring for the formula)."""

    poll: float
    beat: float
    stale: float
    quick: int = 1  # pauses at the first length before they double (see QUICK_POLLS)

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
        stale = max(STALE, STALE_BEATS * beat, loss_bound or 0.0)
        return cls(poll=POLL * scale, beat=beat, stale=stale, quick=QUICK_POLLS if world_size <= QUICK_WORLD else 1)


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


# Rank 0's store dies with it, so no heartbeat verdict can be published about it. A joined rank whose store
# connection fails (reset, EOF, refused, a timeout: whichever the call met first, it is only the trigger)
# probes MASTER_ADDR:MASTER_PORT and judges from the probes alone, counted from the failure. A dying process's
# kernel closes its sockets one by one, the established ones typically before the listener: for a moment after
# the connection broke, the listener still completes TCP handshakes and then resets them without a word (20 of
# 30 first probes on a loaded 2-core machine, issue 34). So a probe is a sign, never a verdict on its own:
#
# * ``serving``  -- a TCPStore answered (a rank 0 restarted within the window): the attempts go on;
# * ``network``  -- the name, the route or the connect failed: the attempts go on and name it (their graces);
# * ``absent``   -- nothing listens (refused), or a listener dropped the connection (as it was made or
#   later) or answered foreign bytes: no store is served there;
# * ``unclear``  -- a listener took the connection and said nothing within the handshake bound (a frozen host,
#   or a dying one whose listener is still open), or another socket error.
#
# Rank 0 is gone once ``stale`` s (the loss bound) have passed since the failure without a store answering,
# and the latest probe found it absent. A host that stayed ``unclear`` all along (frozen: TCP up, no answer)
# is not named: the attempts and the deadline handle it, as before.
#: What one probe of the store host's port says (see above).
StoreSign = Literal["serving", "absent", "unclear", "network"]
#: ``gone``: name rank 0; ``retry``: the attempts go on; ``probe``: probe again.
HostVerdict = Literal["gone", "retry", "probe"]


def store_sign(kind: ProbeKind, detail: str) -> StoreSign:
    """What a probe of the store host's port (:func:`distinit._net.probe`'s ``kind`` and ``detail``) says."""
    if kind == "tcpstore":
        return "serving"
    if kind == "refused":
        return "absent"
    if kind == "foreign":  # accepted: dropped or foreign bytes is no store; no answer in time is unclear
        return "unclear" if "did not answer" in detail else "absent"
    if kind in ("dns", "unreachable", "timeout"):
        return "network"
    if kind == "error" and f"[Errno {errno.ECONNRESET}]" in detail:
        return "absent"  # reset as the connection was made: a listener that took it and dropped it (no store)
    return "unclear"


def judge_store_host(seen: Sequence[StoreSign], *, since_failure: float, stale: float) -> HostVerdict:
    """Whether the store host left, from the signs of the probes since this rank's store call failed.

    ``seen``: the signs in order, the last one just now; ``since_failure``: seconds from the failure to now (this
    rank's own clock); ``stale``: the loss bound. Pure: the tests drive it with sequences and numbers.
    """
    if not seen:
        return "probe"
    last = seen[-1]
    if last in ("serving", "network"):
        return "retry"
    if since_failure < stale:
        return "probe"
    if last == "absent":
        return "gone"
    # Unclear now: a host that was never seen absent is frozen or unreachable (not named); one that was is
    # probed again (its listener may be closing right now).
    return "probe" if "absent" in seen else "retry"
