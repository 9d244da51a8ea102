"""``python -m distinit.doctor``: the doctor alone (``distinit doctor`` is the same command)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distinit.cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``distinit doctor`` with ``argv`` (default ``sys.argv[1:]``); return its exit status."""
    return cli_main(["doctor", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
