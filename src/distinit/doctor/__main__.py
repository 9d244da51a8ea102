"""``python -m distinit.doctor``: the doctor alone (``distinit doctor`` is the same command)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from distinit.doctor._cli import add_doctor_arguments, run_from_args


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the doctor, return its exit status."""
    parser = argparse.ArgumentParser(prog="python -m distinit.doctor", description="distinit doctor")
    add_doctor_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
