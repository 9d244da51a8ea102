"""Typed reads of one environment mapping, and the draft world a launcher module fills in.

Every launcher module reads through :class:`Vars`, so a bad value always produces the same
``MalformedEnvError`` naming the variable, and fills a :class:`Draft`, so every value carries
the variables (or the rule) it came from.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from distinit.env._model import Launcher
from distinit.errors import IncompleteEnvError, MalformedEnvError

_INTEGER = re.compile(r"-?[0-9]+")
#: torch stores ranks and sizes in C ints.
_INT_MAX = 2**31 - 1

#: Deterministic ports land here: above the classic 10000-19999 service ports that Lightning and
#: ignite use (15000 + job id digits), below Linux's default ephemeral range (32768-60999) so the
#: kernel never hands the port to an outgoing connection (NVIDIA/enroot#243).
PORT_RANGE = (20000, 32767)


class Vars:
    """Reads of one ``Mapping[str, str]`` that parse strictly and name the variable on failure."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def has(self, *names: str) -> bool:
        """Whether any of ``names`` is set (to anything, even an empty string)."""
        return any(name in self._environ for name in names)

    def present(self, *names: str) -> list[str]:
        """The subset of ``names`` that is set, in the given order."""
        return [name for name in names if name in self._environ]

    def raw(self, name: str) -> str | None:
        """The value as set, or ``None``."""
        return self._environ.get(name)

    def text(self, name: str) -> str | None:
        """The value with surrounding whitespace removed; ``None`` when unset.

        Raises:
            MalformedEnvError: the variable is set to an empty or blank string.
        """
        value = self._environ.get(name)
        if value is None:
            return None
        stripped = value.strip()
        if not stripped:
            raise MalformedEnvError(
                f"{name}={value!r} is empty.",
                variables=(name,),
                why="an empty value usually comes from `export NAME=$UNSET_VARIABLE` in a job script.",
                fix=f"unset {name} or give it a value.",
            )
        return stripped

    def first(self, *names: str) -> tuple[str, str] | None:
        """``(name, text)`` of the first of ``names`` that is set."""
        for name in names:
            value = self.text(name)
            if value is not None:
                return name, value
        return None

    def integer(self, name: str, *, minimum: int = 0) -> int | None:
        """The value as a decimal integer ``>= minimum``; ``None`` when unset.

        Raises:
            MalformedEnvError: not a plain decimal integer, below ``minimum`` or above 2**31-1.
        """
        value = self.text(name)
        if value is None:
            return None
        if _INTEGER.fullmatch(value) is None:
            raise MalformedEnvError(
                f"{name}={self._environ[name]!r} is not an integer.",
                variables=(name,),
                fix=f"set {name} to a plain decimal number, or unset it and let the launcher set it.",
            )
        number = int(value)
        if number < minimum or number > _INT_MAX:
            raise MalformedEnvError(
                f"{name}={number} is out of range: it must be between {minimum} and {_INT_MAX}.",
                variables=(name,),
                fix=f"check what sets {name}.",
            )
        return number

    def first_integer(self, *names: str, minimum: int = 0) -> tuple[str, int] | None:
        """``(name, value)`` of the first of ``names`` that is set, parsed as by :meth:`integer`."""
        for name in names:
            number = self.integer(name, minimum=minimum)
            if number is not None:
                return name, number
        return None

    def require_integer(self, name: str, *, launcher: str, minimum: int = 0, fix: str = "") -> int:
        """Like :meth:`integer`, but a missing variable is an ``IncompleteEnvError``."""
        number = self.integer(name, minimum=minimum)
        if number is None:
            raise IncompleteEnvError(
                f"{launcher} was detected but {name} is not set.",
                variables=(name,),
                why=f"{launcher} always sets {name} for the processes it starts; without it the rank or size "
                "cannot be known.",
                fix=fix or f"start the process with {launcher} itself, or export {name}.",
            )
        return number


@dataclass
class Draft:
    """A world being resolved: values, where each came from, and notes. Turned into a ``DistEnv`` at the end.

    ``trusted_node_rank`` is False when ``node_rank`` is an assumption (block layout, one process
    per pod) that an explicit ``NODE_RANK`` may override.
    """

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    num_nodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None
    restart_count: int = 0
    trusted_node_rank: bool = True
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def put(self, name: str, value: object, *sources: str) -> None:
        """Set field ``name`` to ``value`` (if not None) and record its sources."""
        if value is None:
            return
        setattr(self, name, value)
        self.sources[name] = tuple(sources)

    def note(self, text: str) -> None:
        """Record an assumption or warning (once)."""
        if text not in self.notes:
            self.notes.append(text)


def hashed_port(*parts: str) -> int:
    """A port in 20000-32767 that is a pure function of ``parts`` (job id, step id).

    Identical on every rank (no rank, host or time in the hash) and different for concurrent
    steps of one job, unlike ``15000 + last 4 digits of the job id``.
    """
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    low, high = PORT_RANGE
    return low + int.from_bytes(digest[:8], "big") % (high - low + 1)
