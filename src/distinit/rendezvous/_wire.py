"""The records agents exchange as JSON on the store (cards, failed workers), validated here without pydantic.

Every torchrun agent with ``--rdzv-backend=distinit`` loads the handler, and pydantic's first model costs an
agent about 0.3 s of CPU (measured: ``BaseModel``'s import and schema build; ``benchmarks/bench_torchrun.py``
and docs/torchrun.md "Against c10d"), more than everything else the backend adds on the happy path. The two
records are flat, so a frozen dataclass whose ``__post_init__`` checks each field against its annotation does
what the pydantic model did: a record that exists is valid, a peer's JSON that does not validate raises
``ValueError`` naming the field (the handler skips it), unknown keys are ignored (a newer distinit's card
still reads). The one deviation from STYLE.md section 3 ("results are frozen pydantic models"), for that cost.

Validation is strict where pydantic's lax mode coerced: an ``int`` field takes an int only (never a bool, a
float or a numeric string); a ``float`` field takes an int or a float. Agents write their own records with the
right types, so nothing an agent writes is refused.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal, TypeVar, Union

R = TypeVar("R")


#: Each record class's resolved field annotations, computed once.
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls``'s fields (strings under ``from __future__ import annotations``)."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _fits(value: object, hint: Any) -> bool:
    """Whether ``value`` is of type ``hint``.

    The few shapes records use: scalars, optionals, literals, ``tuple[str, ...]`` and ``dict[str, str]``.
    """
    origin = typing.get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin is tuple:
        (item, _) = typing.get_args(hint)
        return isinstance(value, tuple) and all(_fits(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint)
        return isinstance(value, dict) and all(_fits(k, key) and _fits(v, item) for k, v in value.items())
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def check(record: object) -> None:
    """Raise ``ValueError`` naming the first field of the dataclass ``record`` that does not fit its annotation.

    Call it from ``__post_init__``: a record built from a peer's JSON is then as trustworthy as one built here.
    """
    for name, hint in _hints(type(record)).items():
        value = getattr(record, name)
        if not _fits(value, hint):
            raise ValueError(f"{type(record).__name__}.{name}: {value!r} is not {hint}")


def from_object(cls: type[R], data: object) -> R:
    """A ``cls`` record from a decoded JSON object (lists read as tuples, unknown keys ignored).

    Raises:
        ValueError: ``data`` is not an object, a required field is missing, or a field does not fit.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: a JSON object was expected, not {type(data).__name__}")
    hints = _hints(cls)
    values = {
        name: tuple(value) if isinstance(value, list) and typing.get_origin(hints[name]) is tuple else value
        for name, value in data.items()
        if name in hints
    }
    try:
        return cls(**values)
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"{cls.__name__}: {exc}") from None


def from_json(cls: type[R], text: str | bytes) -> R:
    """A ``cls`` record from JSON text (see :func:`from_object`).

    Raises:
        ValueError: not JSON (``json.JSONDecodeError`` is one), or not a valid record.
    """
    return from_object(cls, json.loads(text))


def to_object(record: object) -> dict[str, Any]:
    """The record as a JSON-ready dict (tuples become lists when dumped)."""
    return dataclasses.asdict(record)  # type: ignore[call-overload, no-any-return]


def to_json(record: object) -> str:
    """The record as compact JSON text."""
    return json.dumps(to_object(record), separators=(",", ":"))
