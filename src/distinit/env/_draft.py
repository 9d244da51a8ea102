"""Typed reads of one environment mapping, and the draft world a launcher module fills in.

Every launcher module reads through :class:`Vars`, so a bad value always produces the same
``MalformedEnvError`` naming the variable, and fills a :class:`Draft`, so every value carries
the variables (or the rule) it came from. :func:`single` and :func:`not_launched` build the
one-process world that several launchers fall back to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from distinit._text import decimal, quoted
from distinit.env._model import Launcher
from distinit.errors import IncompleteEnvError, MalformedEnvError, NotLaunchedError

#: torch stores ranks and sizes in C ints.
_INT_MAX = 2**31 - 1


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

    def quoted(self, name: str) -> str:
        """The value as set, quoted for a message (cut when long); ``None`` when unset."""
        value = self._environ.get(name)
        return "None" if value is None else quoted(value)

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
                f"{name}={quoted(value)} is empty.",
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

    def integer(self, name: str, *, minimum: int | None = 0) -> int | None:
        """The value as a decimal integer ``>= minimum``; ``None`` when unset.

        ``minimum=None``: no range check at all (the caller checks its own range and names it).

        Raises:
            MalformedEnvError: not a plain decimal integer, below ``minimum`` or above 2**31-1.
        """
        value = self.text(name)
        if value is None:
            return None
        magnitude = decimal(value.removeprefix("-"))
        if magnitude is None:
            raise MalformedEnvError(
                f"{name}={quoted(self._environ[name])} is not an integer.",
                variables=(name,),
                fix=f"set {name} to a plain decimal number, or unset it and let the launcher set it.",
            )
        number = -magnitude if value.startswith("-") else magnitude
        if minimum is not None and (number < minimum or number > _INT_MAX):
            shown = number if abs(number) <= _INT_MAX else quoted(value)
            raise MalformedEnvError(
                f"{name}={shown} is out of range: it must be between {minimum} and {_INT_MAX}.",
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

    def first_count(self, *names: str) -> tuple[str, int] | None:
        """``(name, count)`` of the first of ``names`` that holds a process count (a positive decimal).

        Lenient on purpose, unlike :meth:`integer`: a count read this way only names, in a message, how many
        processes a launcher says it started, so a value that is not one (``""``, ``"0"``, ``"-1"``,
        ``"abc"``, Unicode digits, above 2**31-1) means "this launcher does not say", never an error.
        """
        for name in names:
            value = self._environ.get(name)
            number = None if value is None else decimal(value.strip())
            if number is not None and 1 <= number <= _INT_MAX:
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
    launched: int | None = None
    agent_store: bool = False
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


def single(note: str) -> Draft:
    """The world of one process that no launcher started (rank 0 of 1 on one node), with ``note``."""
    draft = Draft(launcher="none", rank=0, world_size=1)
    draft.sources.update(rank=("rule: not launched",), world_size=("rule: not launched",))
    draft.put("local_rank", 0, "rule: not launched")
    draft.put("local_world_size", 1, "rule: not launched")
    draft.put("node_rank", 0, "rule: not launched")
    draft.put("num_nodes", 1, "rule: not launched")
    draft.note(note)
    return draft


def not_launched(
    what: str, *, strict: bool, variables: tuple[str, ...], why: str, fix: str, job_id: str | None = None
) -> Draft:
    """Raise ``NotLaunchedError`` in strict mode; otherwise a single-process world that says why.

    ``variables[0]`` is the variable that shows the job (its value is ``job_id``).
    """
    if strict:
        raise NotLaunchedError(what, variables=variables, why=why, fix=fix)
    draft = single(f"not launched ({what}); strict=False: running as a single process.")
    draft.put("job_id", job_id, variables[0])
    return draft
