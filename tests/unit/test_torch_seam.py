"""torch's private names are read only in the seam modules, and only the names listed here (issue 35).

The scan is static (``ast``), so it sees what a reader sees:

- an import of a private torch module (``torch._C``, ``torch.distributed._x``) or of a private name from a
  torch module (``from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname``);
- an attribute chain rooted at a name bound to torch (``torch._foreach_copy_``, ``dist._store``);
- ``getattr``/``hasattr``/``setattr`` with a private name spelled as a string (``getattr(x, "_state_holder")``),
  which distinit never needs for its own attributes;
- ``obj._name`` where ``_name`` is defined nowhere in distinit: a private attribute of someone else's object,
  which in this package means torch's (``self._inner._state_holder``). Attributes of the stdlib modules a file
  imports (``sys._getframe``) are not torch's and are not counted. The scan cannot see ``obj._name`` when distinit
  also defines a ``self._name`` (``module._buffers``): such a read still belongs in a seam, by review.

A new private name must be added to :data:`ALLOWED` on purpose, in its seam module, with a fallback for a torch
that lacks it; an entry no longer used fails too, so the list stays the truth.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "distinit"

#: Seam module (path under src/distinit) -> the private torch names it may use. Nothing else may use any.
ALLOWED: dict[str, frozenset[str]] = {
    "rendezvous/_torch.py": frozenset(
        {
            "_matches_machine_hostname",  # torch's "is this host the endpoint" check
            "_state_holder",  # DynamicRendezvousHandler's round state
            "_bootstrap_store_info",  # the shared workers' store, forgotten between rounds
            "_shared_tcp_store_server",
            "_remaining_restarts",  # the elastic agent's --max-restarts budget
            "_worker_group",
            "_this_node",  # the address torch names this node by
        }
    ),
    "_torch.py": frozenset(
        {
            "_foreach_copy_",  # one kernel for many copies; a per-tensor copy_ where missing
            "_get_default_store",  # the formed group's store, for liveness after setup()
            "_set_pg_timeout",  # the collective timeout, set once the group formed
            "_world",  # its group_count, reset after a failed init (pytorch/pytorch#46561)
            "_parameters",  # nn.Module's own tensors, read without named_parameters()' cost
            "_buffers",
            "_get_sequence_number_for_group",  # collectives issued per group, for the hang verdict
        }
    ),
}

#: Private names of other libraries (not torch's) that the scan cannot tell apart from torch's.
NOT_TORCH: dict[str, frozenset[str]] = {
    "testing/_marker.py": frozenset({"_fixtureinfo"}),  # pytest's Function item
}

_ATTR_CALLS = {"getattr", "hasattr", "setattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_in_distinit() -> set[str]:
    """Every private name distinit itself defines: attributes it assigns, functions, classes, fields, imports."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return {name for name in names if _private(name)}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def private_torch_names(tree: ast.AST, ours: set[str]) -> set[str]:
    """The private torch names one module uses (see the module docstring for what counts)."""
    torch_bound: set[str] = set()
    other_modules: set[str] = set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                bound = alias.asname or parts[0]
                if parts[0] == "torch":
                    torch_bound.add(bound)
                    found.update(part for part in parts if _private(part))
                else:
                    other_modules.add(bound)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            found.update(part for part in node.module.split(".") if _private(part))
            for alias in node.names:
                torch_bound.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] != "distinit":
            other_modules.update(alias.asname or alias.name for alias in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node)
            root_name = root.id if isinstance(root, ast.Name) else None
            if root_name in torch_bound or (node.attr not in ours and root_name not in other_modules):
                found.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTR_CALLS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.add(node.args[1].value)
    return found


def _scan() -> dict[str, set[str]]:
    ours = _defined_in_distinit()
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        names = private_torch_names(ast.parse(path.read_text(encoding="utf-8")), ours)
        if names:
            found[path.relative_to(SRC).as_posix()] = names
    return found


def test_private_torch_names_appear_only_in_the_seams() -> None:
    allowed = {module: ALLOWED.get(module, frozenset()) | NOT_TORCH.get(module, frozenset()) for module in _scan()}
    stray = {module: sorted(names - allowed[module]) for module, names in _scan().items() if names - allowed[module]}
    assert not stray, f"private torch names outside the seams (move them to a _torch.py, or list them): {stray}"


def test_every_allowed_name_is_still_used() -> None:
    found = _scan()
    stale = {module: sorted(names - found.get(module, set())) for module, names in {**ALLOWED, **NOT_TORCH}.items()}
    assert not any(stale.values()), f"listed in ALLOWED but no longer used (remove them): {stale}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import torch._C\n", {"_C"}, id="private-module"),
        pytest.param("from torch.a.utils import _x, y\n", {"_x"}, id="private-name-from-torch"),
        pytest.param("import torch\ntorch._foreach_copy_(a, b)\n", {"_foreach_copy_"}, id="torch-attribute"),
        pytest.param("import torch.distributed as dist\ndist.group._x\n", {"_x"}, id="aliased-torch-chain"),
        pytest.param('getattr(h, "_state_holder", None)\n', {"_state_holder"}, id="getattr-string"),
        pytest.param("self._inner._state_holder.state\n", {"_state_holder"}, id="foreign-attribute"),
        pytest.param("self._inner.ours\nself._mine\n", set(), id="our-own-attributes"),
        pytest.param("import sys\nsys._getframe(1)\n", set(), id="stdlib-private-not-torch"),
    ],
)
def test_the_scan_sees(source: str, expected: set[str]) -> None:
    assert private_torch_names(ast.parse(source), {"_inner", "_mine"}) == expected
