"""Launcher and scheduler variables → one validated torch world (pure: no torch, no I/O)."""

from distinit._hostlist import expand_hostlist
from distinit.env._api import env_from_scheduler
from distinit.env._model import DistEnv, Launcher

__all__ = ["DistEnv", "Launcher", "env_from_scheduler", "expand_hostlist"]
