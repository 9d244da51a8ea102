"""distinit: torch.distributed start-up and coordination that survive real launchers.

The public face of the package: imports and ``__all__`` only. See the docs for each capability
(``docs/``) and ``distinit.errors`` for the exception tree.

Only the errors are imported eagerly; every other name is resolved on first use. This package is
imported by the pytest plugin that pytest loads into *every* session of anyone who installs distinit,
so ``import distinit`` must cost next to nothing: ``init`` and ``broadcast`` import torch (a second or
more), ``env`` and ``watchdog`` import pydantic. The table below is static (no dispatch by pattern),
and type checkers see the real imports through ``TYPE_CHECKING``. This is the one deviation from the
house style's "no ``__getattr__``" rule, for that reason.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from distinit.errors import (
    BroadcastError,
    BroadcastMismatchError,
    BroadcastTimeoutError,
    ConflictingEnvError,
    DistinitError,
    DistributedTestError,
    DuplicateRankError,
    IncompleteEnvError,
    MalformedEnvError,
    MasterUnreachableError,
    NotLaunchedError,
    PortInUseError,
    RankLostError,
    RendezvousError,
    RendezvousTimeoutError,
    SchedulerEnvError,
    WatchdogError,
    WorldSizeMismatchError,
)

if TYPE_CHECKING:
    from distinit.broadcast import (
        broadcast_module,
        broadcast_object,
        broadcast_state_dict,
        broadcast_tensor,
        flatten_module_,
    )
    from distinit.env import DistEnv, env_from_scheduler, expand_hostlist
    from distinit.hang import HANG_EXIT_CODE
    from distinit.init import AttemptRecord, Backoff, InitReport, SetupResult, init_with_retry, setup, teardown
    from distinit.watchdog import AutoTimeout, WatchdogClient, WatchdogEvent, WatchdogServer

__version__ = "0.1.0"

#: Names imported on first attribute access, and the package each lives in.
_LAZY = {
    "DistEnv": "distinit.env",
    "env_from_scheduler": "distinit.env",
    "expand_hostlist": "distinit.env",
    "AutoTimeout": "distinit.watchdog",
    "WatchdogClient": "distinit.watchdog",
    "WatchdogEvent": "distinit.watchdog",
    "WatchdogServer": "distinit.watchdog",
    "AttemptRecord": "distinit.init",
    "Backoff": "distinit.init",
    "InitReport": "distinit.init",
    "SetupResult": "distinit.init",
    "init_with_retry": "distinit.init",
    "setup": "distinit.init",
    "teardown": "distinit.init",
    "broadcast_module": "distinit.broadcast",
    "broadcast_object": "distinit.broadcast",
    "broadcast_state_dict": "distinit.broadcast",
    "broadcast_tensor": "distinit.broadcast",
    "flatten_module_": "distinit.broadcast",
    "HANG_EXIT_CODE": "distinit.hang",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'distinit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "HANG_EXIT_CODE",
    "AttemptRecord",
    "AutoTimeout",
    "Backoff",
    "BroadcastError",
    "BroadcastMismatchError",
    "BroadcastTimeoutError",
    "ConflictingEnvError",
    "DistEnv",
    "DistinitError",
    "DistributedTestError",
    "DuplicateRankError",
    "IncompleteEnvError",
    "InitReport",
    "MalformedEnvError",
    "MasterUnreachableError",
    "NotLaunchedError",
    "PortInUseError",
    "RankLostError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "SchedulerEnvError",
    "SetupResult",
    "WatchdogClient",
    "WatchdogError",
    "WatchdogEvent",
    "WatchdogServer",
    "WorldSizeMismatchError",
    "__version__",
    "broadcast_module",
    "broadcast_object",
    "broadcast_state_dict",
    "broadcast_tensor",
    "env_from_scheduler",
    "expand_hostlist",
    "flatten_module_",
    "init_with_retry",
    "setup",
    "teardown",
]
