"""``python -m distinit.doctor``: the same command as ``distinit doctor``.

The doctor's options are defined once, with the ``distinit`` command (``distinit/cli.py``), so that
``distinit doctor --help`` imports neither torch nor the checks. This entry point runs that command by
module name, as ``python -m distinit.cli doctor ...`` does: no capability imports the CLI (the layering rule),
an entry point may run it.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    """Run ``distinit doctor`` with this process's arguments; exits with its status."""
    sys.argv = ["distinit", "doctor", *sys.argv[1:]]
    runpy.run_module("distinit.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
