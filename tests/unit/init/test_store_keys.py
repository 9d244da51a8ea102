"""The join's store keys are spelled in one module of ``init``: ``_join`` owns the layout (issue 36 item 2).

:class:`distinit.init._join.Keys` spells one generation's keys; the heartbeat is handed one and the attempt
machine and the group former ask the join. This test reads every module of ``src/distinit/init`` with
:mod:`ast` (never imports it) and lists where a key of the layout is spelled. A spelling is:

* a string, or a literal part of an f-string, holding ``claim/``, ``beat/`` or ``order/`` (at its start or
  after a ``/``), or ending in ``/<name>`` for a name of :data:`NAMES` (``"t/g0/state"``);
* a literal part of an f-string that follows a formatted value (``f"{prefix}joined"``) and is a name of
  :data:`NAMES` or starts with one and a ``/``;
* a string equal to a name of :data:`NAMES` passed as a positional argument to ``_key``/``key``/``Board`` or to a
  method of an expression that names a store (``self.store.add("joined", 0)``, ``store.check(["state"])``).

Docstrings do not count (they document the layout), nor do dictionary keys and keyword arguments (the
structured log records name ``generation`` and ``world_size``). ``scripts/measure_shape.py`` loads this file
by path and reports :func:`outside_owner` as ``store_keys_outside_owner``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

INIT = Path(__file__).resolve().parents[3] / "src" / "distinit" / "init"
#: Key names that end in a number (``claim/<rank>``).
SLASHED = ("claim", "beat", "order")
#: Every name of the join's layout (the module docstring of ``_join``), the generation counter included.
NAMES = (*SLASHED, "joined", "state", "init_verdict", "world_size", "missing", "generation", "pg")
#: name -> the modules of ``init`` that may spell it. ``_liveness`` beats ``beat/<rank>`` of its own layout,
#: after ``setup()``, on its own ``PrefixStore`` (``distinit``): another store's key of the same name.
OWNERS: dict[str, frozenset[str]] = {
    **{name: frozenset({"_join.py"}) for name in NAMES},
    "beat": frozenset({"_join.py", "_liveness.py"}),
}
#: Callees whose positional string arguments are keys.
KEY_CALLS = ("_key", "key", "Board")

_SLASHED = re.compile(rf"(?:^|/)({'|'.join(SLASHED)})/")
_ENDS = re.compile(rf"/({'|'.join(NAMES)})$")


def _docstrings(tree: ast.AST) -> set[int]:
    """``id``s of the docstring constants of ``tree``'s module, classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _fragment(text: str, *, after_value: bool) -> str | None:
    """The key name ``text`` spells (see the module docstring), or None."""
    slashed = _SLASHED.search(text)
    if slashed:
        return slashed.group(1)
    ends = _ENDS.search(text)
    if ends:
        return ends.group(1)
    if after_value:
        head = text.split("/", 1)[0]
        if head in NAMES:
            return head
    return None


def _key_arguments(tree: ast.AST) -> set[int]:
    """``id``s of the string constants passed positionally (or in a list) to a callee that takes keys."""
    found: set[int] = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        on_store = isinstance(func, ast.Attribute) and "store" in ast.unparse(func.value).lower()
        if name in KEY_CALLS or on_store:
            for arg in call.args:
                items = arg.elts if isinstance(arg, ast.List | ast.Tuple) else [arg]
                found.update(id(item) for item in items if isinstance(item, ast.Constant))
    return found


def spellings(source: str) -> list[tuple[int, str]]:
    """(line, key name) for every key of the join's layout spelled in ``source``."""
    tree = ast.parse(source)
    skip, arguments = _docstrings(tree), _key_arguments(tree)
    in_fstrings: set[int] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            for index, part in enumerate(node.values):
                in_fstrings.add(id(part))
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    after = index > 0 and isinstance(node.values[index - 1], ast.FormattedValue)
                    name = _fragment(part.value, after_value=after)
                    if name is not None:
                        found.append((node.lineno, name))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in skip or id(node) in in_fstrings:
            continue
        name = _fragment(node.value, after_value=False)
        if name is None and id(node) in arguments and node.value in NAMES:
            name = node.value
        if name is not None:
            found.append((node.lineno, name))
    return sorted(found)


def spelled(init: Path = INIT) -> dict[str, list[str]]:
    """key name -> ``module:line`` of every spelling of it in the modules of ``init``."""
    found: dict[str, list[str]] = {}
    for path in sorted(init.glob("*.py")):
        for line, name in spellings(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(f"{path.name}:{line}")
    return found


def outside_owner(init: Path = INIT) -> list[str]:
    """``module:line name`` of every spelling of a join key outside the modules that own it (:data:`OWNERS`)."""
    return [
        f"{where} {name}"
        for name, places in sorted(spelled(init).items())
        for where in places
        if where.partition(":")[0] not in OWNERS[name]
    ]


def test_only_the_join_spells_the_joins_store_keys() -> None:
    found = spelled()
    # The scan sees the layout where it lives: without this, a scan that found nothing would pass.
    for name in ("claim", "beat", "order", "joined", "state", "init_verdict", "world_size", "generation"):
        assert any(where.startswith("_join.py:") for where in found.get(name, [])), (name, found.get(name))
    assert outside_owner() == []


@pytest.mark.parametrize(
    ("source", "names"),
    [
        pytest.param('store.set(f"{self.prefix}beat/{self.rank}", "1|0")', ["beat"], id="fstring-prefix-slashed"),
        pytest.param('store.add(f"{prefix}joined", 0)', ["joined"], id="fstring-prefix-bare"),
        pytest.param('keys = [f"{prefix}order/{n}" for n in range(3)]', ["order"], id="fstring-in-a-list"),
        pytest.param('store.get(f"beat/{rank}")', ["beat"], id="fstring-slashed-first"),
        pytest.param('self._key(generation, "state")', ["state"], id="key-call-bare"),
        pytest.param('self._key(generation, f"claim/{rank}")', ["claim"], id="key-call-fstring"),
        pytest.param('self.store.check(["init_verdict"])', ["init_verdict"], id="store-method-list"),
        pytest.param('Board(store, "state", rank=0, world_size=2)', ["state"], id="board"),
        pytest.param('KEY = "t/g0/world_size"', ["world_size"], id="whole-key"),
        pytest.param('CLAIM = "claim/0"', ["claim"], id="whole-slashed"),
        pytest.param('x = f"{ns}generation"', ["generation"], id="generation-counter"),
    ],
)
def test_the_scan_finds_each_way_of_spelling_a_key(source: str, names: list[str]) -> None:
    assert [name for _, name in spellings(source)] == names


@pytest.mark.parametrize(
    "source",
    [
        pytest.param('def f():\n    """Reads ``claim/<rank>`` and ``joined``."""', id="docstring"),
        pytest.param('log(extra={"generation": generation, "world_size": 4})', id="log-record-keys"),
        pytest.param('data.get("generation")', id="a-dict-not-a-store"),
        pytest.param('logger.info("rank %d joined", 1)', id="prose"),
        pytest.param('f"{count} ranks joined the state"', id="prose-fstring"),
        pytest.param('Keys("t/g0/").claim(0)', id="asking-the-layout"),
    ],
)
def test_the_scan_ignores_what_is_no_key(source: str) -> None:
    assert spellings(source) == []
