"""The errors the torchrun rendezvous handler raises: torch's classes, so torchrun's ``except`` clauses still match.

House rule (STYLE.md section 1): distinit's errors never subclass torch's. These are the one exception, asked for
by issue 25: an agent's caller (torchrun's elastic agent, a user's ``except RendezvousTimeoutError``) catches
torch's classes, and a handler that raised anything else would escape those clauses. Each class is therefore
both the torch error and a :class:`distinit.errors.RendezvousError` (so ``except distinit.DistinitError``
catches it too); the MRO is torch's class first, then ours. Both bases derive from plain ``Exception`` and add
no ``__init__`` of their own on torch's side, so the two combine cleanly; pickling goes through
:meth:`DistinitError.__reduce__`, which never runs these constructors. They live here, not in ``errors.py``,
because ``errors.py`` must not import torch.
"""

from __future__ import annotations

from torch.distributed.elastic.rendezvous import api as torch_api

import distinit.errors as errors

#: Where every fix this package gives points for more (one place: the errors and the pre-flight both cite it).
DOCS = "docs/torchrun.md#troubleshooting"

__all__ = [
    "AgentConfigMismatchError",
    "AgentRendezvousClosedError",
    "AgentRendezvousConnectionError",
    "AgentRendezvousTimeoutError",
    "AgentRoundTooSmallError",
]


class AgentRendezvousTimeoutError(torch_api.RendezvousTimeoutError, errors.RendezvousError):
    """The agents' rendezvous did not complete within ``join_timeout``; says who joined, who did not, and why.

    Attributes (besides :class:`distinit.errors.RendezvousError`'s): ``joined`` (``"host pid N"`` of the nodes
    that joined this round), ``lost`` (nodes that were seen, then stopped heart-beating).
    """

    joined: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()


class AgentRendezvousConnectionError(torch_api.RendezvousConnectionError, errors.RendezvousError):
    """This agent cannot use the rendezvous endpoint (unresolvable, refused, foreign, black-holed).

    ``kind`` is the probe's verdict: ``dns``, ``refused``, ``timeout``, ``unreachable``, ``foreign``,
    ``loopback`` or ``error``.
    """

    kind: str = ""


class AgentRendezvousClosedError(torch_api.RendezvousClosedError, errors.RendezvousError):
    """The rendezvous was closed by another agent (its job ended or failed) while this one waited."""


class AgentConfigMismatchError(torch_api.RendezvousError, errors.RendezvousError):
    """Agents of one job (or of two jobs on one endpoint) disagree on a flag, a version or ``--rdzv-id``.

    The flags: ``--nnodes``, ``--nproc-per-node``, ``--max-restarts``; the versions: torch, python,
    distinit. Raised on every agent that sees it.

    ``field`` names the flag or version the agents disagree on.
    """

    field: str = ""


class AgentRoundTooSmallError(torch_api.RendezvousError, errors.RendezvousError):
    """torch formed a round with fewer agents than ``--nnodes``' minimum: its workers would run too small a world.

    Seen when torch's keep-alive, which compares wall clocks across nodes, counts a joined agent whose clock is
    behind as dead. ``left_out`` names the live agents of the job outside the round.
    """

    left_out: tuple[str, ...] = ()


for _cls in (
    AgentConfigMismatchError,
    AgentRendezvousClosedError,
    AgentRendezvousConnectionError,
    AgentRendezvousTimeoutError,
    AgentRoundTooSmallError,
):
    _cls.__module__ = "distinit.rendezvous"  # its public home: reprs and pickles never name a private module
