"""The settings of one ``@pytest.mark.distributed`` test: validated once, each with where it came from.

A value comes from the marker, from an ini key (``distributed_timeout``, ``distributed_reuse``) or
from the default, in that order, and :attr:`DistributedOptions.sources` records which (as
pytest-timeout's validators are told their ``where``). A bad value is a ``pytest.UsageError``
naming the marker argument or the ini key and the value: the ini keys when the session is
configured, a marker when its test is collected (failing only that test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from distinit._duration import to_seconds

__all__ = [
    "DEFAULT_TIMEOUT",
    "INI_DEFAULTS",
    "KNOWN_ARGUMENTS",
    "MARKER",
    "MARKER_HELP",
    "DistributedOptions",
    "IniDefaults",
    "options_for",
    "read_ini",
]

MARKER = "distributed"
MARKER_HELP = (
    "distributed(world_size=2, backend='gloo', timeout=None, gpus_per_rank=0, reuse=False, env=None, "
    "init=True): run the test function on each of world_size ranks (real processes, default process "
    "group initialised); the test fails with every failed rank's traceback, exit code or stack"
)
DEFAULT_TIMEOUT = 60.0
KNOWN_ARGUMENTS = ("world_size", "backend", "timeout", "gpus_per_rank", "reuse", "env", "init")


@dataclass(frozen=True)
class IniDefaults:
    """The session-wide defaults from the ini file, read and validated once at configure time."""

    timeout: float = DEFAULT_TIMEOUT
    reuse: bool = False
    timeout_source: str = "default"
    reuse_source: str = "default"


#: Where the plugin keeps the session's :class:`IniDefaults`.
INI_DEFAULTS = pytest.StashKey[IniDefaults]()


@dataclass(frozen=True)
class DistributedOptions:
    """The marker's arguments, validated; ``sources`` maps each field to "marker", "ini <key>" or "default"."""

    world_size: int = 2
    backend: str = "gloo"
    timeout: float = DEFAULT_TIMEOUT
    gpus_per_rank: int = 0
    reuse: bool = False
    env: tuple[tuple[str, str], ...] = ()
    init: bool = True
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, name: str) -> str:
        """Where the value of field ``name`` came from ("marker", "ini distributed_timeout", "default")."""
        return dict(self.sources).get(name, "default")


def read_ini(config: pytest.Config) -> IniDefaults:
    """The ini keys ``distributed_timeout`` and ``distributed_reuse``, validated.

    Raises:
        pytest.UsageError: a value that is not seconds > 0, or not a boolean, naming the key and the value.
    """
    raw = config.getini("distributed_timeout")
    timeout, timeout_source = DEFAULT_TIMEOUT, "default"
    if raw not in (None, "", []):
        try:
            timeout = to_seconds(float(str(raw).strip()), "distributed_timeout")
        except (TypeError, ValueError) as exc:
            raise pytest.UsageError(
                f"ini option distributed_timeout = {raw!r} is not a number of seconds > 0 "
                f"(e.g. distributed_timeout = 60): {exc}"
            ) from None
        timeout_source = "ini distributed_timeout"
    try:
        raw_reuse = config.getini("distributed_reuse")
    except ValueError as exc:  # pytest < 9 (pytest 9 raises a UsageError itself)
        raise pytest.UsageError(f"ini option distributed_reuse is not a boolean (true/false): {exc}") from None
    # Registered without a default, so an unset key reads as None (pytest >= 9) or [] (older).
    reuse = bool(raw_reuse) if raw_reuse not in (None, "", []) else False
    reuse_source = "ini distributed_reuse" if raw_reuse not in (None, "", []) else "default"
    return IniDefaults(timeout=timeout, reuse=reuse, timeout_source=timeout_source, reuse_source=reuse_source)


def _marker_values(item: pytest.Item, marker: pytest.Mark) -> dict[str, Any]:
    """The marker's arguments by name, with its positional ``world_size`` folded in."""
    if len(marker.args) > 1:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.distributed takes at most one positional argument")
    unknown = sorted(set(marker.kwargs) - set(KNOWN_ARGUMENTS))
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: unknown @pytest.mark.distributed argument(s) {unknown}; known: {list(KNOWN_ARGUMENTS)}"
        )
    values = dict(marker.kwargs)
    if marker.args:
        values["world_size"] = marker.args[0]
    return {name: value for name, value in values.items() if not (name == "timeout" and value is None)}


def _count(item: pytest.Item, name: str, value: object, *, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise pytest.UsageError(f"{item.nodeid}: distributed({name}=...) must be an int >= {least}, got {value!r}")
    return value


def _validated(item: pytest.Item, values: dict[str, Any], ini: IniDefaults) -> DistributedOptions:
    try:
        timeout = to_seconds(values.get("timeout", ini.timeout), "timeout")
    except (TypeError, ValueError):
        raise pytest.UsageError(
            f"{item.nodeid}: distributed(timeout=...) must be seconds > 0, got {values['timeout']!r}"
        ) from None
    env = values.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise pytest.UsageError(f"{item.nodeid}: distributed(env=...) must be a dict of str to str, got {env!r}")
    return DistributedOptions(
        world_size=_count(item, "world_size", values.get("world_size", 2), least=1),
        backend=str(values.get("backend", "gloo")),
        timeout=timeout,
        gpus_per_rank=_count(item, "gpus_per_rank", values.get("gpus_per_rank", 0), least=0),
        reuse=bool(values.get("reuse", ini.reuse)),
        env=tuple(sorted(env.items())),
        init=bool(values.get("init", True)),
    )


def options_for(item: pytest.Item) -> DistributedOptions | None:
    """Read ``@pytest.mark.distributed`` of ``item`` (None when absent).

    Raises:
        pytest.UsageError: an unknown argument or a bad value, naming the test, the argument and the value.
    """
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    ini = item.config.stash.get(INI_DEFAULTS, None) or read_ini(item.config)
    values = _marker_values(item, marker)
    options = _validated(item, values, ini)
    fallback = {"timeout": ini.timeout_source, "reuse": ini.reuse_source}
    sources = tuple((name, "marker" if name in values else fallback.get(name, "default")) for name in KNOWN_ARGUMENTS)
    return DistributedOptions(**{**vars(options), "sources": sources})
