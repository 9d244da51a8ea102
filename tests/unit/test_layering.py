"""The import layering of the package, enforced: every import statement in src/distinit, lazy ones included.

The rules of docs/architecture.md, one test each (STYLE.md section 1): the leaves (errors, durations,
foreign-error text, the probe, the board) import only the standard library, and the torch seam (``_torch``) only
torch besides; ``_identity`` imports no module of ours and no torch; env imports no other capability and no
torch; broadcast and watchdog know nothing of init or of each other; rendezvous imports no init; no capability
imports the testing plugin, the CLI or the package face (``import distinit``), and the one arrow into the CLI is
``doctor/__main__.py``; no module imports another package's ``_private`` module (shared helpers are top-level
modules or a package's exports); inside init, every module imports only modules after it in :data:`INIT_ORDER`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "distinit"
LEAVES = ("errors", "_duration", "_foreign", "_net", "_board")
CAPABILITIES = ("env", "init", "broadcast", "watchdog", "testing", "integrations", "doctor", "rendezvous", "hang")
#: capability -> the distinit packages it may import besides itself and the leaves.
ALLOWED = {
    "env": set(),
    "init": {"env", "_identity", "_torch", "hang"},
    "broadcast": {"_torch"},
    "watchdog": set(),
    "testing": {"env", "init", "broadcast", "watchdog"},
    "integrations": {"env", "init"},
    "doctor": {"env", "init", "_identity"},
    "rendezvous": {"env", "_identity"},  # torchrun's handler, loaded by the agents: never init
    "hang": set(),  # the hang verdict: pure judging and stack sampling, driven by init's liveness thread
}
#: Inside init, the data path first: a module may import only modules after it (docs/architecture.md).
INIT_ORDER = (
    "_api",
    "_device",
    "_attempt",
    "_form",
    "_join",
    "_heartbeat",
    "_store",
    "_thread",
    "_liveness",
    "_loopback",
    "_messages",
    "_policy",
    "_report",
)
#: The one module allowed to import the CLI: ``python -m distinit.doctor``.
CLI_IMPORTERS = {"distinit.doctor.__main__"}
#: What the package face or the CLI is; no capability imports these.
FACES = {"distinit", "distinit.cli", "distinit.testing.plugin"}


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module named by an import in ``path`` (relative imports resolved), at any depth."""
    found: set[str] = set()
    if not path.is_relative_to(SRC):
        package = ""
    elif path.name == "__init__.py":
        package = _name(path)
    else:
        package = _name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _layer(module: str) -> str | None:
    """The capability or leaf a ``distinit.*`` module belongs to (None for the face and the CLI)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1]


def _distinit_imports(path: Path) -> set[str]:
    return {name for name in _imports(path) if name == "distinit" or name.startswith("distinit.")}


def test_the_walk_sees_every_module() -> None:
    names = {_name(path) for path in _modules()}
    assert {"distinit.errors", "distinit.env", "distinit.init", "distinit.broadcast", "distinit.watchdog"} <= names


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaves_import_only_the_standard_library(leaf: str) -> None:
    path = SRC / f"{leaf}.py"
    foreign = {name.split(".")[0] for name in _imports(path)} - set(sys.stdlib_module_names) - {"__future__"}
    assert not foreign, f"distinit.{leaf} must import only the standard library, imports {sorted(foreign)}"


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_capability_imports_point_one_way(capability: str) -> None:
    allowed = {capability, *LEAVES, *ALLOWED[capability]}
    bad: list[str] = []
    for path in sorted((SRC / capability).rglob("*.py")):
        own = _name(path)
        # A `python -m distinit.<capability>` entry point is a face itself: it may run the CLI, nothing else may.
        entry_point = path.name == "__main__.py"
        for name in sorted(_distinit_imports(path)):
            if entry_point and name.startswith("distinit.cli"):
                continue
            if name in FACES and name != own and not (capability == "testing" and name.startswith("distinit.testing")):
                bad.append(f"{own} imports {name} (the package face, the CLI or the plugin)")
            elif name != "distinit" and _layer(name) not in allowed:
                bad.append(f"{own} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_torch_seam_imports_only_torch_and_the_standard_library() -> None:
    # distinit._torch is a leaf over torch (issue 35): the seams stay free of our own machinery.
    foreign = {name.split(".")[0] for name in _imports(SRC / "_torch.py")} - set(sys.stdlib_module_names)
    assert foreign <= {"__future__", "torch"}, f"distinit._torch imports {sorted(foreign)}"


def test_env_never_imports_torch() -> None:
    # Resolution stays pure and its tests fast: no torch, not even lazily.
    bad = [
        f"{_name(path)} imports {name}"
        for path in sorted((SRC / "env").rglob("*.py"))
        for name in sorted(_imports(path))
        if name == "torch" or name.startswith("torch.")
    ]
    assert not bad, "\n".join(bad)


def test_no_private_torch_c10d_imports() -> None:
    # Public torch.distributed names exist for every store and group type we use.
    bad = [
        f"{_name(path)} imports {name}"
        for path in _modules()
        for name in sorted(_imports(path))
        if name.startswith("torch._C._distributed_c10d")
    ]
    assert not bad, "\n".join(bad)


def test_a_violation_is_seen(tmp_path: Path) -> None:
    # The walk is what the checks stand on: a lazy, nested import must be found.
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    if True:\n        from distinit.init import setup\n        import torch\n")
    assert {"distinit.init", "distinit.init.setup", "torch"} <= _imports(module)


def test_host_identity_is_shared_and_torch_free() -> None:
    # init, the doctor and the rendezvous card share this one implementation; it stays pure: pydantic only.
    names = _imports(SRC / "_identity.py")
    assert not [name for name in names if name == "torch" or name.startswith("torch.")]
    assert not [name for name in names if name.startswith("distinit")]


def test_rendezvous_imports_no_init() -> None:
    # torchrun's agents load the handler; the rendezvous of init (and its torch groups) stays out of them.
    bad = [
        f"{_name(path)} imports {name}"
        for path in sorted((SRC / "rendezvous").rglob("*.py"))
        for name in sorted(_distinit_imports(path))
        if _layer(name) == "init"
    ]
    assert not bad, "\n".join(bad)


def test_only_the_doctor_entry_point_imports_the_cli() -> None:
    importers = {
        _name(path) for path in _modules() if any(_layer(name) == "cli" for name in _distinit_imports(path))
    } - {"distinit.cli"}
    assert importers == CLI_IMPORTERS


def test_init_imports_point_down_its_order() -> None:
    modules = {path.stem for path in (SRC / "init").glob("_*.py")} - {"__init__"}
    assert modules == set(INIT_ORDER), "a module of init is missing from INIT_ORDER (or one listed is gone)"
    bad = []
    for rank, module in enumerate(INIT_ORDER):
        names = _distinit_imports(SRC / "init" / f"{module}.py")
        # `from distinit.init import _loopback` and `from distinit.init._policy import Pace` both name the module.
        imported = {name.split(".")[2] for name in names if name.startswith("distinit.init.")}
        for other in sorted(imported & set(INIT_ORDER[: rank + 1]) - {module}):
            bad.append(f"init.{module} imports init.{other}, which comes before it")
    assert not bad, "\n".join(bad)


def _private_reach(own: str, names: set[str]) -> list[str]:
    """Which of ``names`` (imported by module ``own``) are another package's ``_private`` modules."""
    here = own.split(".")[1] if "." in own else ""
    bad = []
    for name in sorted(names):
        parts = name.split(".")
        if len(parts) < 3 or parts[1] == here:
            continue  # the package face, a top-level module (distinit._net), or this package's own modules
        if any(part.startswith("_") for part in parts[2:]):
            bad.append(f"{own} imports {name}")
    return bad


def test_no_module_reaches_into_another_packages_private_modules() -> None:
    # A package's face is its __init__ (its exports); its _modules are its own. Shared helpers live in
    # top-level modules (distinit._duration, _identity, _net, _board) or are exported by their package.
    # A `python -m` entry point (__main__.py) may run the CLI, as test_capability_imports_point_one_way says.
    bad = [
        line
        for path in _modules()
        if path.name != "__main__.py"
        for line in _private_reach(_name(path), _distinit_imports(path))
    ]
    assert not bad, "\n".join(bad)


def test_a_private_reach_is_seen(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "def f():\n    from distinit.init._join import JoinProtocol\n    from distinit._net import probe\n"
    )
    names = {name for name in _imports(module) if name.startswith("distinit.")}
    assert _private_reach("distinit.doctor._probe", names) == [
        "distinit.doctor._probe imports distinit.init._join",
        "distinit.doctor._probe imports distinit.init._join.JoinProtocol",
    ]
