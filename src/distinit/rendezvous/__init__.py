"""``torchrun --rdzv-backend=distinit``: torch's dynamic rendezvous that says why it failed.

Registered under the ``torchrun.handlers`` entry point as ``distinit`` (torch calls :func:`handler` and
registers the creator it returns). torch imports this package into every torchrun agent, so it imports only
the errors and the light entry point; the handler itself loads on first use. See ``docs/torchrun.md``.
"""

# Order matters: ``handler`` must be bound before ``_errors`` imports torch's rendezvous package, whose import
# loads this entry point (see ``_entry``); tests/integration/rendezvous/test_entry_point.py holds it.
from distinit.rendezvous._entry import create_handler, handler
from distinit.rendezvous._errors import (
    AgentConfigMismatchError,
    AgentRendezvousClosedError,
    AgentRendezvousConnectionError,
    AgentRendezvousTimeoutError,
    AgentRoundTooSmallError,
)

__all__ = [
    "AgentConfigMismatchError",
    "AgentRendezvousClosedError",
    "AgentRendezvousConnectionError",
    "AgentRendezvousTimeoutError",
    "AgentRoundTooSmallError",
    "create_handler",
    "handler",
]
