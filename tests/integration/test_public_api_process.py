"""Guards that keep the public shape honest, in a fresh interpreter (a child process each): ``import distinit``
(no torch, no pydantic), ``from distinit import setup`` (issue 35: no pydantic, no model built, no torch), the
pytest plugin, ``distinit.env`` and ``distinit.errors`` (no torch).

The guards that need no process (exports, the error tree, the faces) are in ``tests/unit/test_public_api.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_distinit_does_not_import_torch() -> None:
    # The pytest plugin imports the package in every user's pytest session: it must stay light.
    code = "import sys, distinit; sys.exit('torch' in sys.modules or 'pydantic' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
    code = "import sys, distinit.testing.plugin; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_env_and_errors_never_import_torch() -> None:
    code = "import sys, distinit.env, distinit.errors; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


#: Prints what ``from distinit import setup`` added to ``sys.modules`` (after ``import torch`` when asked), then
#: what naming a model of init imports and whether it is the pydantic model that pickles by its public name.
_SETUP_IMPORT = """
import json, pickle, sys
if sys.argv[1] == "torch":
    import torch
before = set(sys.modules)
from distinit import setup
added = sorted(set(sys.modules) - before)
from distinit import SetupResult
import pydantic
print(json.dumps({
    "added": added,
    "model": issubclass(SetupResult, pydantic.BaseModel),
    "pickles": pickle.loads(pickle.dumps(SetupResult)) is SetupResult,
    "module": SetupResult.__module__,
}))
"""


def _import_setup(first: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _SETUP_IMPORT, first], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_from_distinit_import_setup_after_torch_imports_neither_pydantic_nor_the_work() -> None:
    # Issue 35: a script's `from distinit import setup` after `import torch` builds no pydantic model; the
    # work of the call (and its models) is imported by the call. The models are still pydantic's, on first use.
    seen = _import_setup("torch")
    added = seen["added"]
    assert isinstance(added, list)
    assert not [m for m in added if m.split(".")[0] in ("pydantic", "pydantic_core", "tenacity")], added
    assert {"distinit.init._setup", "distinit.env", "distinit.hang"}.isdisjoint(added), added
    assert {"distinit.init", "distinit.init._api"} <= set(added), added
    assert seen == {**seen, "model": True, "pickles": True, "module": "distinit.init"}


def test_from_distinit_import_setup_imports_no_torch() -> None:
    # Without torch first, the import of the call does not bring it either (the call imports it).
    added = _import_setup("bare")["added"]
    assert isinstance(added, list)
    assert not [m for m in added if m.split(".")[0] in ("torch", "pydantic")], added
