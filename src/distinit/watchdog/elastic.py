"""distinit.watchdog.elastic: a drop-in for ``torch.distributed.elastic.timer``'s FileTimer.

Replace ``import torch.distributed.elastic.timer as timer`` with ``import distinit.watchdog.elastic as timer``:
same names, constructors and FIFO protocol; the server never signals itself, never signals a reused pid,
records a stack dump before the requested signal and notices expiries at their deadline. Linux only.
See ``docs/watchdog.md`` ("Migrating from torch's FileTimer").
"""

from distinit.watchdog._timer_client import FileTimerClient, FileTimerRequest, TimerClient, configure, expires
from distinit.watchdog._timer_server import FileTimerServer

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "TimerClient",
    "configure",
    "expires",
]
