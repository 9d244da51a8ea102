"""distinit.watchdog: a same-host watchdog that kills exactly the hung worker, after a stack dump.

Linux only. See ``docs/watchdog.md``.
"""

from distinit.watchdog._auto import AutoTimeout
from distinit.watchdog._client import Heartbeat, WatchdogClient
from distinit.watchdog._daemon import add_watchdog_parser
from distinit.watchdog._events import WatchdogEvent
from distinit.watchdog._global import configure, expires
from distinit.watchdog._server import WatchdogServer

__all__ = [
    "AutoTimeout",
    "Heartbeat",
    "WatchdogClient",
    "WatchdogEvent",
    "WatchdogServer",
    "add_watchdog_parser",
    "configure",
    "expires",
]
