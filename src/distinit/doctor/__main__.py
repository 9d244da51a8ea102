"""``python -m distinit.doctor``: the same command as ``distinit doctor``.

The doctor's options are defined once, with the ``distinit`` command (``distinit/cli.py``), so that
``distinit doctor --help`` imports neither torch nor the checks. An entry point is a face like the CLI
itself, so this module (and only ``__main__`` modules) may import the CLI (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distinit.cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``distinit doctor`` with ``argv`` (default: this process's arguments); return its exit status."""
    return cli_main(["doctor", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
