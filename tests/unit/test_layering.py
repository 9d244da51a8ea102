"""The import layering of the package, enforced: every import statement in src/distinit, lazy ones included.

The rules of docs/architecture.md, one test each (STYLE.md section 1): the leaves (errors, durations,
foreign-error text, the probe, the board, the guarded wait, the port policy, Slurm's list grammars, variable
text) import only the standard library and each other, and the torch seam (``_torch``) only torch besides;
``_identity`` imports no module of ours and no torch; env imports no other capability and no torch; broadcast
and watchdog know nothing of init or of each other; rendezvous imports no init; no capability imports the
testing plugin, the CLI or the package face (``import distinit``), and the one arrow into the CLI is
``doctor/__main__.py``; no module imports another package's ``_private`` module (shared helpers are leaves or
a package's exports); inside init, every module imports only modules after it in :data:`INIT_ORDER`; a face
(``distinit/__init__.py``, each ``distinit/<package>/__init__.py``) binds only its ``__all__``, its
submodules, dunders and the names in :data:`FACE_EXTRAS`, each with its reason (``scripts/measure_shape.py``
reports against the same list).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "distinit"
#: Modules that import no distinit package: the standard library and each other only (``_torch``, ``_identity``
#: are top-level too, with their own rules below).
LEAVES = ("errors", "_duration", "_foreign", "_net", "_board", "_guarded", "_port", "_hostlist", "_text")
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
    # torchrun's handler, loaded by every agent: never init, and neither env nor _identity (their pydantic models
    # cost an agent about 0.3 s of CPU; issue 35)
    "rendezvous": set(),
    "hang": set(),  # the hang verdict: pure judging and stack sampling, driven by init's liveness thread
}
#: Inside init, the data path first: a module may import only modules after it (docs/architecture.md).
INIT_ORDER = (
    "_api",
    "_setup",
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
#: face -> name -> why: what a face binds outside its ``__all__`` (besides submodules and dunders). Public is
#: "listed in an ``__all__``"; anything else a face binds is a side door that another package (or a face's own
#: machinery) needs, so it is named here with its reason, and docs/architecture.md lists the same names.
FACE_EXTRAS: dict[str, dict[str, str]] = {
    "distinit": {
        "TYPE_CHECKING": "the lazy face's machinery: type checkers see the real imports behind it",
        "Any": "the lazy face's machinery: the type of __getattr__'s answer",
        "importlib": "the lazy face's machinery: __getattr__ imports a capability on first use",
        "_LAZY": "the lazy face's table: each public name and the package it lives in",
    },
    "distinit.init": {
        "TYPE_CHECKING": "the lazy face's machinery: type checkers see the real imports behind it",
        "Any": "the lazy face's machinery: the type of __getattr__'s answer",
        "importlib": "the lazy face's machinery: __getattr__ imports a module of init on first use",
        "_LAZY": "the lazy face's table (issue 35: `from distinit import setup` builds no pydantic model): each "
        "lazily resolved name and the module it lives in",
        "lost_peer": "the Lightning integration names the rank that went away from setup()'s liveness, which is "
        "init's process state: only init can answer",
        "check_advertised_address": "the doctor's names check applies setup()'s own loopback rule (its evidence "
        "and wording are init's)",
        "host_store": "the doctor's post-mortem hosts the store as rank 0 does (IPv4 listener, libuv fallback); "
        "a store leaf waits for the retry engine's failure split (issue 36 item 7), which these raise",
        "connect_store": "the doctor's post-mortem joins the store as setup() does (a bounded, abandonable connect); "
        "see host_store",
        "AttemptFailed": "what host_store and connect_store raise for a failure waiting may cure; the doctor "
        "catches it",
        "Unsupported": "what host_store and connect_store raise for a failure no retry cures (a feature this torch "
        "lacks); the doctor's post-mortem catches it (it never raises)",
    },
    "distinit.doctor": {
        "run_from_args": "the `distinit doctor` command: the CLI (distinit.cli) parses the arguments, the doctor runs",
        "gather_json": "`distinit env --check` (the CLI) gathers every rank's identity with the doctor's bounded, "
        "numpy-free exchange",
        "destroy_world": "`distinit env --check` (the CLI) ends the gather's world the way the doctor does: the "
        "gathers' works and tensors are held until the group is destroyed (torch 2.4's gloo deadlocked otherwise)",
    },
}


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
def test_leaves_import_only_the_standard_library_and_leaves(leaf: str) -> None:
    path = SRC / f"{leaf}.py"
    ours = {name for name in _distinit_imports(path) if _layer(name) not in LEAVES}
    foreign = (
        {name.split(".")[0] for name in _imports(path)} - set(sys.stdlib_module_names) - {"__future__", "distinit"}
    )
    assert not foreign, f"distinit.{leaf} must import only the standard library, imports {sorted(foreign)}"
    assert not ours, f"distinit.{leaf} must import no distinit package, imports {sorted(ours)}"


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
    # init and the doctor share this one implementation (the rendezvous card reads the same two facts without
    # its pydantic model: see rendezvous/_card.machine); it stays pure: pydantic only.
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
    # leaves (distinit._duration, _net, _board, _port, _hostlist ...) or _identity, never a side door in a face.
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


def face_paths(src: Path = SRC) -> dict[str, Path]:
    """Every face under ``src`` (the ``distinit`` folder): the package's ``__init__.py`` and each public package's."""
    faces = {"distinit": src / "__init__.py"}
    for path in sorted(src.glob("*/__init__.py")):
        if not path.parent.name.startswith("_"):
            faces[f"distinit.{path.parent.name}"] = path
    return faces


def _bound(statements: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """Names bound and names deleted by ``statements`` at run time (an ``if TYPE_CHECKING:`` body binds nothing)."""
    bound: set[str] = set()
    deleted: set[str] = set()
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            bound.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor | ast.With):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [item.optional_vars for item in node.items if item.optional_vars]
                if isinstance(node, ast.With)
                else [node.target]
            )
            bound.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Delete):
            deleted.update(n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name))
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            blocks = [node.body, node.orelse]
        elif isinstance(node, ast.Try):
            blocks = [node.body, node.orelse, node.finalbody, *(handler.body for handler in node.handlers)]
        elif isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.With):
            blocks = [node.body, getattr(node, "orelse", [])]
        else:
            blocks = []
        for block in blocks:
            more, gone = _bound(block)
            bound |= more
            deleted |= gone
    return bound, deleted


def face_extras(path: Path) -> list[str]:
    """The names the face ``path`` binds that are not in its ``__all__``, not its submodules and not dunders.

    A lazy face's table (a module-level ``_LAZY = {name: module}``) binds its keys too: its ``__getattr__``
    answers them, so a side door behind it is still a side door.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    listed: set[str] = set()
    lazy: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            listed = set(ast.literal_eval(node.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            lazy = set(ast.literal_eval(node.value))
    bound, deleted = _bound(tree.body)
    bound |= lazy
    return sorted(
        name
        for name in bound - deleted - listed
        if not (name.startswith("__") and name.endswith("__"))
        and not (path.parent / name).is_dir()
        and not (path.parent / f"{name}.py").is_file()
    )


def test_faces_bind_only_their_public_names_and_the_allowed_extras() -> None:
    # Public means "listed in __all__"; a face that binds more opens a side door. Each one is named, with why.
    faces = face_paths()
    assert set(FACE_EXTRAS) <= set(faces), "FACE_EXTRAS names a face that does not exist"
    bad = [
        f"{face} binds {name!r} outside __all__: list it in __all__ (public), or in FACE_EXTRAS with the reason"
        for face, path in faces.items()
        for name in face_extras(path)
        if name not in FACE_EXTRAS.get(face, {})
    ]
    stale = [
        f"FACE_EXTRAS[{face!r}] allows {name!r}, which the face no longer binds"
        for face, names in FACE_EXTRAS.items()
        for name in names
        if name not in face_extras(faces[face])
    ]
    assert not bad + stale, "\n".join(bad + stale)
    assert all(reason.strip() for names in FACE_EXTRAS.values() for reason in names.values())


def test_a_face_extra_is_seen(tmp_path: Path) -> None:
    face = tmp_path / "__init__.py"
    (tmp_path / "_model.py").write_text("")
    face.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from pkg import _model\n"
        "from pkg._model import Public, helper as helper\n"
        "import importlib\n"
        "if TYPE_CHECKING:\n    from pkg._model import Hidden\n"
        "try:\n    import fast as speed\nexcept ImportError:\n    speed = None\n"
        "for _one in (Public,):\n    _one.__module__ = __name__\n"
        "del _one\n"
        "def __getattr__(name): ...\n"
        "_TABLE = {}\n"
        "_LAZY = {'Public': 'pkg._model', 'door': 'pkg._model'}\n"
        "__all__ = ['Public']\n"
    )
    assert face_extras(face) == ["TYPE_CHECKING", "_LAZY", "_TABLE", "door", "helper", "importlib", "speed"]


def test_the_map_lists_every_allowed_face_extra() -> None:
    # docs/architecture.md carries the same rules as this test, the side doors included.
    text = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    missing = [f"{face}: {name}" for face, names in FACE_EXTRAS.items() for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/architecture.md does not list these face extras: {missing}"
