"""Rendezvous that survives late workers and diagnoses misconfiguration in seconds.

The calls are imported eagerly and cost next to nothing; every other name is resolved on first use.
``from distinit import setup`` imports this face, usually right after ``import torch`` at the top of a
script (issue 35: <= 80 ms over it): the pydantic models (``SetupResult``, ``InitReport``, ``AttemptRecord``,
``Backoff``) and the rendezvous machinery are built when a call runs or a model is named, not before. The
table below is static (no dispatch by pattern), type checkers see the real imports through
``TYPE_CHECKING``, and pickles of the models name this module, which resolves them. The same deviation from
the house style's "no ``__getattr__``" rule as the package face, for the same reason.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from distinit.init._api import init_with_retry, setup, teardown

if TYPE_CHECKING:
    from distinit.init._loopback import check_advertised_address as check_advertised_address
    from distinit.init._policy import AttemptFailed as AttemptFailed
    from distinit.init._policy import Backoff
    from distinit.init._policy import Unsupported as Unsupported
    from distinit.init._report import AttemptRecord, InitReport
    from distinit.init._setup import SetupResult
    from distinit.init._setup import lost_peer as lost_peer
    from distinit.init._store import connect_store as connect_store
    from distinit.init._store import host_store as host_store

#: Names imported on first attribute access, and the module each lives in. The public ones are in
#: ``__all__``; the others are for distinit's other packages (the doctor, the Lightning integration), not
#: for users (docs/architecture.md names each with its reason).
_LAZY = {
    "AttemptRecord": "distinit.init._report",
    "Backoff": "distinit.init._policy",
    "InitReport": "distinit.init._report",
    "SetupResult": "distinit.init._setup",
    "lost_peer": "distinit.init._setup",
    "check_advertised_address": "distinit.init._loopback",
    "AttemptFailed": "distinit.init._policy",
    "Unsupported": "distinit.init._policy",
    "connect_store": "distinit.init._store",
    "host_store": "distinit.init._store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'distinit.init' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["AttemptRecord", "Backoff", "InitReport", "SetupResult", "init_with_retry", "setup", "teardown"]
