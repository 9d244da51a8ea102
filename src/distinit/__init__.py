"""distinit: torch.distributed start-up and coordination that survive real launchers.

The public face of the package: imports and ``__all__`` only. See the docs for each
capability (``docs/``) and ``distinit.errors`` for the exception tree.
"""

from distinit.env import DistEnv, env_from_scheduler, expand_hostlist
from distinit.errors import (
    BroadcastMismatchError,
    ConflictingEnvError,
    DistinitError,
    DistributedTestError,
    DuplicateRankError,
    IncompleteEnvError,
    MalformedEnvError,
    MasterUnreachableError,
    NotLaunchedError,
    PortInUseError,
    RendezvousError,
    RendezvousTimeoutError,
    SchedulerEnvError,
    WatchdogError,
    WorldSizeMismatchError,
)

__version__ = "0.1.0"

__all__ = [
    "BroadcastMismatchError",
    "ConflictingEnvError",
    "DistEnv",
    "DistinitError",
    "DistributedTestError",
    "DuplicateRankError",
    "IncompleteEnvError",
    "MalformedEnvError",
    "MasterUnreachableError",
    "NotLaunchedError",
    "PortInUseError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "SchedulerEnvError",
    "WatchdogError",
    "WorldSizeMismatchError",
    "__version__",
    "env_from_scheduler",
    "expand_hostlist",
]
