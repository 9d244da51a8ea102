"""Guards that keep the public shape honest, in a fresh interpreter (a child process each): ``import distinit``
(no torch, no pydantic), the pytest plugin, ``distinit.env`` and ``distinit.errors`` (no torch).

The guards that need no process (exports, the error tree, the faces) are in ``tests/unit/test_public_api.py``.
"""

from __future__ import annotations

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
