"""``torchrun --rdzv-backend=distinit``: torch's dynamic rendezvous that says why it failed.

Registered under the ``torchrun.handlers`` entry point as ``distinit`` (torch calls :func:`handler` and
registers the creator it returns). See ``docs/torchrun.md``.
"""

from distinit.rendezvous._errors import (
    AgentConfigMismatchError,
    AgentRendezvousClosedError,
    AgentRendezvousConnectionError,
    AgentRendezvousTimeoutError,
)
from distinit.rendezvous._handler import DistinitRendezvousHandler, create_handler, handler

__all__ = [
    "AgentConfigMismatchError",
    "AgentRendezvousClosedError",
    "AgentRendezvousConnectionError",
    "AgentRendezvousTimeoutError",
    "DistinitRendezvousHandler",
    "create_handler",
    "handler",
]
