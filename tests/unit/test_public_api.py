"""Guards that keep the public shape honest: exports, the error tree, import layering.

What a fresh interpreter imports (no torch for ``import distinit``, the plugin, env and errors) is checked in
``tests/integration/test_public_api_process.py``.
"""

from __future__ import annotations
import __future__

import copy
import importlib
import inspect
import itertools
import pickle
import types
from pathlib import Path

import distinit
from distinit import errors
from tests.unit.test_layering import FACE_EXTRAS, face_paths

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_all_lists_exactly_the_public_names() -> None:
    eager = {name for name in vars(distinit) if not name.startswith(("_", "@"))} - {
        "env",
        "errors",
        "init",
        "watchdog",
        "broadcast",
        "testing",
        "integrations",
        "doctor",
        "rendezvous",
        "hang",
        "cli",
        "annotations",
        "importlib",
        "TYPE_CHECKING",
        "Any",
    }
    public = eager | set(distinit._LAZY)
    assert set(distinit.__all__) - {"__version__"} == public
    for name in distinit.__all__:
        assert getattr(distinit, name) is not None, name
    assert set(distinit.__all__) <= set(dir(distinit))


def test_lazy_names_come_from_their_capability() -> None:
    for name, module in distinit._LAZY.items():
        assert getattr(distinit, name) is getattr(importlib.import_module(module), name)


def test_every_error_is_exported_documented_and_picklable() -> None:
    classes = [obj for obj in vars(errors).values() if inspect.isclass(obj) and issubclass(obj, errors.DistinitError)]
    assert len(classes) >= 15
    tree = errors.__doc__ or ""
    for cls in classes:
        assert getattr(distinit, cls.__name__) is cls, f"{cls.__name__} not exported from distinit"
        assert cls.__name__ in tree, f"{cls.__name__} missing from the errors module docstring tree"
        exc = cls("what happened", why="because", fix="do this")
        for clone in (pickle.loads(pickle.dumps(exc)), copy.deepcopy(exc)):
            assert type(clone) is cls and str(clone) == str(exc) and clone.fix == "do this"


def test_scheduler_errors_are_value_errors() -> None:
    assert issubclass(errors.SchedulerEnvError, ValueError)
    assert not issubclass(errors.RendezvousError, OSError)


def test_error_classes_appear_in_troubleshooting() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    for name in ("NotLaunchedError", "IncompleteEnvError", "ConflictingEnvError", "MalformedEnvError"):
        assert name in text


FACES = (
    "distinit",
    "distinit.errors",
    "distinit.env",
    "distinit.init",
    "distinit.watchdog",
    "distinit.watchdog.elastic",
    "distinit.broadcast",
    "distinit.testing",
    "distinit.doctor",
    "distinit.rendezvous",
    "distinit.hang",
    "distinit.integrations.lightning",
)


def _documented_data(name: str) -> bool:
    """A public constant or type alias is documented by a ``#:`` comment right above its definition."""
    for path in (Path(distinit.__file__).parent).rglob("*.py"):
        lines = path.read_text().splitlines()
        for above, line in itertools.pairwise(lines):
            if line.startswith((f"{name} =", f"{name}: ")) and above.startswith("#:"):
                return True
    return False


def test_every_public_name_resolves_and_is_documented() -> None:
    undocumented = []
    for face in FACES:
        module = importlib.import_module(face)
        assert (module.__doc__ or "").strip(), f"{face} has no module docstring"
        assert len(module.__all__) == len(set(module.__all__)), f"{face}.__all__ lists a name twice"
        for name in module.__all__:
            assert hasattr(module, name), f"{face}.__all__ lists {name!r}, which {face} does not define"
            if name == "__version__":
                continue
            assert not name.startswith("_"), f"{face}.__all__ lists the private name {name!r}"
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
                documented = bool((own or "").strip())  # a class's own docstring, not one it inherits
            else:
                documented = _documented_data(name)
            if not documented:
                undocumented.append(f"{face}.{name}")
    assert undocumented == []


def test_public_classes_name_their_public_module() -> None:
    # Pickles and reprs must not name private modules (distinit.watchdog._client.WatchdogClient): a private
    # module may move in any release, and an unpickler would then fail to find the class.
    packages = (
        "distinit",
        "distinit.errors",
        "distinit.env",
        "distinit.init",
        "distinit.watchdog",
        "distinit.watchdog.elastic",
        "distinit.broadcast",
        "distinit.testing",
        "distinit.doctor",
        "distinit.rendezvous",
        "distinit.hang",
    )
    bad = []
    for package in packages:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and obj.__module__ not in packages:
                bad.append(f"{package}.{name}: __module__ is {obj.__module__!r}")
            elif inspect.isclass(obj):
                assert getattr(importlib.import_module(obj.__module__), obj.__qualname__) is obj
    assert not bad, "\n".join(bad)


def test_faces_bind_at_run_time_only_their_public_names_and_the_allowed_extras() -> None:
    # The layering test reads the faces' source; this imports them, so a name bound some other way is seen too.
    bad = []
    for face in face_paths():
        module = importlib.import_module(face)
        public = set(getattr(module, "__all__", ()))
        for name, value in vars(module).items():
            dunder = name.startswith("__") and name.endswith("__")
            submodule = isinstance(value, types.ModuleType) and value.__name__ == f"{face}.{name}"
            future = value is __future__.annotations
            rewrite = name.startswith("@")  # pytest's assertion rewriting (the plugin loads distinit)
            if not (dunder or submodule or future or rewrite or name in public or name in FACE_EXTRAS.get(face, {})):
                bad.append(f"{face}.{name}")
    assert not bad, f"bound by a face outside __all__ and FACE_EXTRAS (tests/unit/test_layering.py): {bad}"
