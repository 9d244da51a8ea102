"""Launcher and scheduler variables → one validated torch world (pure: no torch, no I/O)."""

from distinit.env._api import env_from_scheduler
from distinit.env._hostlist import expand_counts, expand_hostlist
from distinit.env._model import DistEnv, Launcher, master_addr_fix
from distinit.env._port import PORT_ADVICE, check_port

__all__ = [
    "PORT_ADVICE",
    "DistEnv",
    "Launcher",
    "check_port",
    "env_from_scheduler",
    "expand_counts",
    "expand_hostlist",
    "master_addr_fix",
]
