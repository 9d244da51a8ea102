"""The one rendezvous module that reads torch's private internals, each feature-detected, none ever fatal.

torch's dynamic rendezvous keeps what distinit's messages need (the round, its participants, the wait list,
the agent's restart budget) in private attributes that may change in any release. Each is read here through
``getattr`` or a guarded import, and each has a fallback: a missing attribute makes a message less precise
(the round "unknown", every agent of the job checked instead of the round's participants), never a crash.
``tests/unit/test_torch_seam.py`` fails when a private torch name appears anywhere else in the package.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("distinit.rendezvous")


@dataclass(frozen=True)
class RoundState:
    """torch's view of the rendezvous: its round, participants and wait list (node keys ``addr_pid_localid``).

    ``known`` is False when this torch keeps its state elsewhere: the round reads 0, both tuples are empty.
    """

    known: bool
    round: int = 0
    participants: tuple[str, ...] = ()
    wait_list: tuple[str, ...] = ()
    closed: bool = False


UNKNOWN = RoundState(known=False)


def _hostname_matcher() -> Callable[[str], Any] | None:
    try:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
    except ImportError:
        return None
    return _matches_machine_hostname


def matches_machine_hostname(host: str) -> bool | None:
    """The verdict of torch's "does ``host`` name this machine" check; ``None`` when this torch has no such check."""
    check = _hostname_matcher()
    if check is None:
        return None
    try:
        return bool(check(host))
    except (OSError, ValueError):
        return False


def node_key(node: object) -> str:
    """A torch node descriptor (``_NodeDesc``) as ``addr_pid_localid``, from its fields, else its ``repr``."""
    addr, pid, local_id = (getattr(node, name, None) for name in ("addr", "pid", "local_id"))
    if isinstance(addr, str) and isinstance(pid, int) and isinstance(local_id, int):
        return f"{addr}_{pid}_{local_id}"
    return repr(node)


def this_node(handler: object) -> str | None:
    """The address torch's handler names this node by (its private ``_this_node.addr``), or ``None``."""
    addr = getattr(getattr(handler, "_this_node", None), "addr", None)
    return addr if isinstance(addr, str) and addr else None


def node_is(key: str, *, node: str, pid: int) -> bool:
    """Whether the node key names the agent on ``node`` with ``pid`` (False for a key of another shape)."""
    return key.startswith(f"{node}_{pid}_")


def round_state(handler: object) -> RoundState:
    """The state of torch's ``DynamicRendezvousHandler`` (its private ``_state_holder.state``), or :data:`UNKNOWN`."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    if state is None:
        return UNKNOWN
    try:
        return RoundState(
            known=True,
            round=int(getattr(state, "round", 0) or 0),
            participants=tuple(node_key(node) for node in getattr(state, "participants", ())),
            wait_list=tuple(node_key(node) for node in getattr(state, "wait_list", ())),
            closed=bool(getattr(state, "closed", False)),
        )
    except (TypeError, ValueError) as exc:
        logger.debug("could not read torch's rendezvous state: %s", exc)
        return UNKNOWN


def forget_agent_store(handler: object) -> bool:
    """Drop the handler's shared workers' store so torch starts a new one next round; False if it has none."""
    if not hasattr(handler, "_bootstrap_store_info"):
        return False
    handler._bootstrap_store_info = None
    handler._shared_tcp_store_server = None  # type: ignore[attr-defined]
    return True


def restart_budget(agent: object) -> tuple[int, int] | None:
    """``(max_restarts, remaining)`` of torch's elastic agent, or ``None`` (no agent, or another torch)."""
    remaining = getattr(agent, "_remaining_restarts", None)
    most = getattr(getattr(getattr(agent, "_worker_group", None), "spec", None), "max_restarts", None)
    if not isinstance(remaining, int) or not isinstance(most, int):
        return None
    return most, remaining


def take_restart(agent: object) -> bool:
    """Spend one of the agent's ``--max-restarts``; False when it has none left or none can be read."""
    remaining = getattr(agent, "_remaining_restarts", None)
    if not isinstance(remaining, int) or remaining <= 0:
        return False
    agent._remaining_restarts = remaining - 1  # type: ignore[attr-defined]
    return True
