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
    │   └── RendezvousTimeoutError       deadline reached; lists missing ranks and what each attempt saw
    ├── BroadcastMismatchError           broadcast/: ranks disagree; raised on every rank
    ├── WatchdogError                    watchdog/: server/client set-up and protocol faults
    └── DistributedTestError             testing/: one or more ranks of a distributed test failed

This module imports only the standard library, so every other module may use it.
Errors pickle and copy with all their facts (attributes), whatever a subclass's
``__init__`` signature is: see :meth:`DistinitError.__reduce__`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BroadcastMismatchError",
    "ConflictingEnvError",
    "DistinitError",
    "DistributedTestError",
    "DuplicateRankError",
    "IncompleteEnvError",
    "MalformedEnvError",
    "MasterUnreachableError",
    "NotLaunchedError",
    "PortInUseError",
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
    """

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
    """

    def __init__(self, what: str, *, rank: int | None = None, why: str = "", fix: str = "") -> None:
        super().__init__(what, why=why, fix=fix)
        self.rank = rank


class DuplicateRankError(RendezvousError):
    """Two processes claimed the same rank. Never retried: waiting cannot fix it."""


class WorldSizeMismatchError(RendezvousError):
    """Ranks disagree on the world size. Never retried."""


class MasterUnreachableError(RendezvousError):
    """``MASTER_ADDR`` cannot be resolved or reached after the grace period."""


class PortInUseError(RendezvousError):
    """``MASTER_PORT`` is still held by another process after the grace period."""


class RendezvousTimeoutError(RendezvousError):
    """The rendezvous deadline passed; lists the missing ranks and what each attempt saw."""


class BroadcastMismatchError(DistinitError):
    """Ranks of a broadcast disagree (src, shape, dtype, device, schema, keys); raised on every rank."""


class WatchdogError(DistinitError):
    """The watchdog server or client could not be set up, or the protocol was violated."""


class DistributedTestError(DistinitError):
    """One or more ranks of a distributed test failed, crashed or hung."""
