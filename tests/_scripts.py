"""Load a file as a module: the project's scripts (``scripts/<name>.py``, not a package) and files a test writes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_file(path: Path, name: str) -> ModuleType:
    """The module in ``path``, run once as ``name`` and registered in ``sys.modules`` (a dataclass in it resolves its
    annotations through there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py``, with ``scripts/`` on ``sys.path`` while it loads (a script imports its siblings)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return load_file(SCRIPTS / f"{name}.py", name)
    finally:
        sys.path.remove(str(SCRIPTS))
