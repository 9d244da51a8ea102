"""A fault-test rank with the loopback pre-flight switched off, so that gloo itself meets the trap.

Usage: ``python _loopback_worker.py PYTHON _worker.py SPEC OUT`` (the launcher's command after this prefix);
runs ``_worker.py`` as ``__main__`` with ``check_advertised_address`` replaced by a no-op.
"""

from __future__ import annotations

import runpy
import sys

from distinit.init import _loopback


def _skip(*args: object, **kwargs: object) -> None:
    """The pre-flight, switched off: the failure must then be recognised after init."""


_loopback.check_advertised_address = _skip
sys.argv = sys.argv[2:]  # [this, PYTHON, _worker.py, SPEC, OUT] -> [_worker.py, SPEC, OUT]
runpy.run_path(sys.argv[0], run_name="__main__")
