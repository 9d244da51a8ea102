"""Test distributed code on real process groups: ``run_distributed`` and the pytest plugin.

The plugin (``distinit.testing.plugin``) is registered through the ``pytest11`` entry point and adds
the ``distributed`` marker and the ``dist_world`` fixture. See ``docs/testing.md``.
"""

from distinit.testing._run import DistWorld, run_distributed
from distinit.testing._scheduler import LAUNCHERS, compress_hostlist, scheduler_env

__all__ = ["LAUNCHERS", "DistWorld", "compress_hostlist", "run_distributed", "scheduler_env"]
