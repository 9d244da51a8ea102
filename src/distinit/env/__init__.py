"""Launcher and scheduler variables → one validated torch world (pure: no torch, no I/O)."""

from distinit._hostlist import expand_hostlist
from distinit.env._api import env_from_scheduler
from distinit.env._model import DistEnv, Launcher

# Not for users (tests/unit/test_layering.py FACE_EXTRAS says why): the MASTER_ADDR fix wording init's pre-flight
# and the Lightning integration share; its home, env/_model.py, is being reworked (issue 36 item 3). It moves to
# the ``_port`` leaf beside PORT_ADVICE after that.
from distinit.env._model import master_addr_fix as master_addr_fix

__all__ = ["DistEnv", "Launcher", "env_from_scheduler", "expand_hostlist"]
