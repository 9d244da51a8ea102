"""The pytest plugin's import, in a fresh interpreter (a child process): importing it registers no exit hook.

The plugin's settings (validated once, with where each came from) are in ``tests/unit/testing/test_options.py``.
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_plugin_registers_nothing_at_exit() -> None:
    code = (
        "import atexit, logging, multiprocessing.connection, sys, distinit, pytest\n"
        "before = atexit._ncallbacks()  # after the stdlib and pytest registered theirs\n"
        "import distinit.testing, distinit.testing.plugin\n"
        "sys.exit(atexit._ncallbacks() - before)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{done.returncode} exit hook(s) registered at import; {done.stderr}"
