"""The one exception hierarchy of distinit.

Every error distinit raises on purpose derives from :class:`DistinitError`, so
``except distinit.DistinitError`` catches them all. Each message says *what*
happened (with the values), *why* it probably happened, and the *fix*::

    DistinitError                        everything we raise on purpose
    ├── SchedulerEnvError (ValueError)   env/: launcher variables missing, contradictory, unparsable
    │   ├── NotLaunchedError             strict mode and no launcher found
    │   ├── IncompleteEnvError           a needed variable is absent
    │   ├── ConflictingEnvError          two sources disagree
    │   └── MalformedEnvError            a value does not parse (hostlist, integer, port)
    ├── RendezvousError                  init/: the world could not form
    │   ├── DuplicateRankError           never retried
    │   ├── WorldSizeMismatchError       never retried
    │   ├── MasterUnreachableError       DNS / no route / black hole, after its grace period
    │   ├── PortInUseError               MASTER_PORT still held after its grace period
    │   ├── RankLostError                a rank joined, then stopped (died, interrupted, frozen); never retried
    │   └── RendezvousTimeoutError       deadline reached; lists missing ranks and what each attempt saw
    ├── BroadcastError                   broadcast/: a broadcast call failed
    │   ├── BroadcastMismatchError       ranks disagree, or a header is malformed; raised on every rank
    │   └── BroadcastTimeoutError        a collective timed out or lost a peer; raised on the waiting rank
    ├── WatchdogError                    watchdog/: server/client set-up and protocol faults
    └── DistributedTestError             testing/: one or more ranks of a distributed test failed

This module imports only the standard library, so every other module may use it.
Errors pickle and copy with all their facts (attributes), whatever a subclass's
``__init__`` signature is: see :meth:`DistinitError.__reduce__`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BroadcastError",
    "BroadcastMismatchError",
    "BroadcastTimeoutError",
    "ConflictingEnvError",
    "DistinitError",
    "DistributedTestError",
    "DuplicateRankError",
    "IncompleteEnvError",
    "MalformedEnvError",
    "MasterUnreachableError",
    "NotLaunchedError",
    "PortInUseError",
    "RankLostError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "SchedulerEnvError",
    "WatchdogError",
    "WorldSizeMismatchError",
]


def _rebuild(cls: type[DistinitError], args: tuple[Any, ...], state: dict[str, Any]) -> DistinitError:
    """Recreate an error without running the subclass ``__init__`` (used by pickle and copy)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


class DistinitError(Exception):
    """Base of every error distinit raises on purpose.

    Attributes:
        what: what happened, with the values involved.
        why: the likely cause, in one line (may be empty).
        fix: an action the user can take (may be empty).
        cause: the foreign (torch, OS) exception behind it, when there was one: ``setup()`` and
            ``init_with_retry()`` raise the distinit error alone, without the chained tracebacks, keep the
            cause here and log the whole chain at DEBUG.
    """

    cause: BaseException | None = None

    def __init__(self, what: str, *, why: str = "", fix: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.why = why
        self.fix = fix

    def __str__(self) -> str:
        lines = [self.what]
        lines.extend(f"  {label}: {text}" for label, text in (("why", self.why), ("fix", self.fix)) if text)
        return "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


class SchedulerEnvError(DistinitError, ValueError):
    """Launcher or scheduler variables are missing, contradictory or unparsable.

    Attributes:
        variables: the environment variable names involved, as spelled.
    """

    def __init__(self, what: str, *, variables: tuple[str, ...] = (), why: str = "", fix: str = "") -> None:
        super().__init__(what, why=why, fix=fix)
        self.variables = tuple(variables)


class NotLaunchedError(SchedulerEnvError):
    """No launcher started this process as part of a multi-process world (strict mode)."""


class IncompleteEnvError(SchedulerEnvError):
    """A launcher was detected but a variable it must provide is absent."""


class ConflictingEnvError(SchedulerEnvError):
    """Two sources of the same value disagree (e.g. exported ``RANK`` vs the launcher's rank)."""


class MalformedEnvError(SchedulerEnvError):
    """A variable's value does not parse (integer, port, hostlist, tasks-per-node list)."""


class RendezvousError(DistinitError):
    """The process group could not be formed.

    Attributes:
        rank: the rank of the process raising, when known.
        master: the rendezvous endpoint as ``"addr:port"``, when known.
        generation: the rendezvous generation (attempt round on the store), when known.
        ranks: the ranks at fault (the duplicated rank, the missing ranks), possibly empty.
        claimants: ``"host pid N"`` of each process involved (duplicate claims, world-size votes).
        attempts: one line per attempt saying what it saw (deadline errors).
    """

    def __init__(
        self,
        what: str,
        *,
        rank: int | None = None,
        why: str = "",
        fix: str = "",
        master: str | None = None,
        generation: int | None = None,
        ranks: tuple[int, ...] = (),
        claimants: tuple[str, ...] = (),
        attempts: tuple[str, ...] = (),
    ) -> None:
        super().__init__(what, why=why, fix=fix)
        self.rank = rank
        self.master = master
        self.generation = generation
        self.ranks = tuple(ranks)
        self.claimants = tuple(claimants)
        self.attempts = tuple(attempts)


class DuplicateRankError(RendezvousError):
    """Two processes claimed the same rank. Never retried: waiting cannot fix it."""


class WorldSizeMismatchError(RendezvousError):
    """Ranks disagree on the world size. Never retried."""


class MasterUnreachableError(RendezvousError):
    """``MASTER_ADDR`` cannot be resolved or reached after the grace period."""


class PortInUseError(RendezvousError):
    """``MASTER_PORT`` is still held by another process after the grace period."""


class RankLostError(RendezvousError):
    """A rank joined the rendezvous and then stopped beating (died, was interrupted or froze). Never retried.

    ``ranks`` is the lost rank, ``claimants`` its ``"host pid N"``; raised on every rank that waited.
    """


class RendezvousTimeoutError(RendezvousError):
    """The rendezvous deadline passed; lists the missing ranks and what each attempt saw."""


class BroadcastError(DistinitError):
    """A broadcast call failed; base of :class:`BroadcastMismatchError` and :class:`BroadcastTimeoutError`.

    Attributes:
        call: the API call, e.g. ``"broadcast_tensor"``.
        seq: the call's sequence number in its group (``#12`` in the message).
        field: what went wrong (see each subclass for its values).
        src: the group-local source rank (as the majority passed it; ``None`` when unknown).
        views: each group rank's view of ``field``, in words (``{0: "sends float32[2, 3]", ...}``).
        ranks: the group ranks at fault.
    """

    def __init__(
        self,
        what: str,
        *,
        call: str = "",
        seq: int = -1,
        field: str = "",
        src: int | None = None,
        views: dict[int, str] | None = None,
        ranks: tuple[int, ...] = (),
        why: str = "",
        fix: str = "",
    ) -> None:
        super().__init__(what, why=why, fix=fix)
        self.call = call
        self.seq = seq
        self.field = field
        self.src = src
        self.views = dict(views or {})
        self.ranks = tuple(ranks)


class BroadcastMismatchError(BroadcastError):
    """Ranks of a broadcast disagree (src, shape, dtype, device, schema, keys), or a header is malformed.

    Raised on every rank of the group, before any payload moves, except ``field="payload"``. The
    wording is composed from the facts in one place (``distinit.broadcast._mismatch``), so the error
    is identical on every rank of the group.

    ``field`` is what the ranks disagree on: ``"src"``, ``"shape"``, ``"dtype"``, ``"device"``,
    ``"schema"``, ``"keys"``, ``"metadata"``, ``"call"``, ``"sequence"``, ``"argument"``,
    ``"protocol"``, ``"header"`` (a rank sent a header that contradicts itself or exceeds a bound;
    ``ranks`` names it), ``"size"`` (src sends more than a receiver's ``max_bytes=`` allows),
    ``"transport"`` (ranks passed different ``via=``, or the shared segment or file of ``via="shm"``/
    ``"file"`` could not be made); or ``"payload"``: src's bytes do not validate (raised on the receivers
    only; ``ranks`` is src), or, with ``via="file"``, the file is missing, truncated or fails its checksum
    (raised on every rank).
    """


class BroadcastTimeoutError(BroadcastError):
    """A broadcast collective did not complete within ``timeout=``, or a peer died during it.

    Raised on the rank that waited (the others may be elsewhere); ``field`` is ``"timeout"`` or
    ``"peer"``. The process group is unusable afterwards: destroy it.
    """


class WatchdogError(DistinitError):
    """The watchdog server or client could not be set up, or the protocol was violated."""


class DistributedTestError(DistinitError):
    """One or more ranks of a distributed test failed, crashed or hung.

    Attributes:
        failures: failed rank -> one-line summary ("raised ValueError: boom", "was killed by SIGKILL").
        details: rank -> its full section (traceback or Python stack, stdout and stderr prefixed by rank),
            for failed ranks and for ranks the harness stopped; printed after ``why``/``fix``.
        world_size: number of ranks of the run.
    """

    def __init__(
        self,
        what: str,
        *,
        failures: dict[int, str] | None = None,
        details: dict[int, str] | None = None,
        world_size: int | None = None,
        why: str = "",
        fix: str = "",
    ) -> None:
        super().__init__(what, why=why, fix=fix)
        self.failures = dict(failures or {})
        self.details = dict(details or {})
        self.world_size = world_size

    @property
    def ranks(self) -> tuple[int, ...]:
        """The failed ranks, in ascending order."""
        return tuple(sorted(self.failures))

    def __str__(self) -> str:
        return "\n".join([super().__str__(), *self.details.values()])
