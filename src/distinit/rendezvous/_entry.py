"""The ``torchrun.handlers`` entry point, kept light: torch loads it into every torchrun agent.

torch's ``torch.distributed.elastic.rendezvous`` package walks the ``torchrun.handlers`` entry points when it
is imported, so this module is imported by every torchrun (whatever ``--rdzv-backend``) of anyone who installs
distinit. It therefore imports nothing heavy: the handler (torch's rendezvous backends, distinit's probes and
cards; no pydantic since issue 35) loads only when ``--rdzv-backend=distinit`` creates a handler. The same
deviation from "imports at the top" as ``distinit/__init__.py``, for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Not at run time: importing torch's rendezvous package walks the ``torchrun.handlers`` entry points and
    # asks this package for ``handler``. Importing it from here would ask before ``handler`` exists whenever
    # ``distinit.rendezvous`` is imported first (a user's ``except AgentRendezvousTimeoutError``): torch
    # then logs "partially initialized module" and the backend is missing from that process.
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The ``torchrun.handlers`` entry point: torch calls this and registers what it returns as ``distinit``."""
    return create_handler


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Torch's dynamic rendezvous handler for ``params``, with distinit's pre-flight, consensus and messages.

    Accepts every ``--rdzv-conf`` key of torch's c10d backend, plus ``connect_timeout`` (seconds a refused
    endpoint is waited on, default 30) and ``shared_endpoint`` (1: several jobs share the endpoint on purpose).

    Raises:
        AgentRendezvousConnectionError: the endpoint is unusable; the message says why.
    """
    from distinit.rendezvous._handler import create

    return create(params)
