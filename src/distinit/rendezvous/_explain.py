"""Why the agents' rendezvous timed out or closed, composed from facts (pure: facts in, message out).

The facts come from torch's dynamic rendezvous state as torch itself already decoded it in this agent
(round, participants, wait list) and from the agents' cards and heart-beats on the store (JSON). The message
stays under 20 lines: the first says what, then who joined (since when), who was seen and stopped, who never
came, then why and the fix.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from distinit.rendezvous._card import AgentCard
from distinit.rendezvous._errors import (
    DOCS,
    AgentRendezvousClosedError,
    AgentRendezvousConnectionError,
    AgentRendezvousTimeoutError,
)
from distinit.rendezvous._torch import node_is

#: At most this many agents are named per line.
NAMED = 6


@dataclass(frozen=True)
class Snapshot:
    """What this agent knows when its rendezvous ends without a round."""

    run_id: str
    endpoint: str
    round: int
    min_nodes: int
    max_nodes: int
    participants: tuple[str, ...]  # torch node descriptors (``addr_pid_localid``) of this round
    wait_list: tuple[str, ...]
    waited: float  # seconds this agent waited
    join_timeout: float
    cards: tuple[AgentCard, ...]  # this job's agents that published themselves
    beats: Mapping[int, float] = field(default_factory=dict)  # card index -> last beat (wall clock)
    beat_interval: float = 5.0
    now: float = 0.0  # wall clock at the verdict
    torch_state: bool = True  # False: this torch's round state could not be read (round, both tuples unknown)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _names(labels: Sequence[str]) -> str:
    shown = ", ".join(labels[:NAMED])
    return shown + (f" and {len(labels) - NAMED} more" if len(labels) > NAMED else "")


def _in(card: AgentCard, nodes: Sequence[str]) -> bool:
    return any(node_is(key, node=card.node, pid=card.pid) for key in nodes)


def _nnodes(snap: Snapshot) -> str:
    return str(snap.min_nodes) if snap.min_nodes == snap.max_nodes else f"{snap.min_nodes}:{snap.max_nodes}"


def lost_agents(snap: Snapshot) -> list[tuple[AgentCard, float]]:
    """Agents of this job whose heart-beat stopped (more than three intervals old), with their last beat."""
    stale = snap.now - 3 * snap.beat_interval
    found = []
    for index, card in enumerate(snap.cards):
        beat = snap.beats.get(index, card.started)
        if beat < stale:
            found.append((card, beat))
    return found


def _joined(snap: Snapshot, alive: int) -> str:
    if not snap.torch_state:  # the less precise wording: see _torch.round_state
        return "how many had joined torch's round is unknown (distinit cannot read this torch's rendezvous state)."
    head = f"{len(snap.participants)} had joined torch's round {snap.round} when it timed out"
    return head + ("." if len(snap.participants) >= alive else " (the others that came wait elsewhere: see below).")


def explain_timeout(snap: Snapshot) -> AgentRendezvousTimeoutError:
    """The timeout error for ``snap``: who joined, who stopped, who never came, why and the fix. Pure."""
    waiting = [card for card in snap.cards if _in(card, snap.wait_list)]
    lost = lost_agents(snap)
    lost_cards = [card for card, _ in lost]
    alive = [card for card in snap.cards if card not in lost_cards]
    round_ = f"round {snap.round}" if snap.torch_state else "its round"
    lines = [
        f"the rendezvous {snap.run_id!r} at {snap.endpoint} did not complete {round_} in {snap.waited:.1f} s "
        f"(join_timeout={snap.join_timeout:g} s): {len(alive)} of --nnodes={_nnodes(snap)} agents came "
        f"(heart-beating on the store); {_joined(snap, len(alive))}"
    ]
    if alive:
        lines.append("  came: " + _names([f"{c.label} (node {c.node}, since {_clock(c.started)})" for c in alive]))
    if waiting:
        lines.append("  waiting for the next round: " + _names([c.label for c in waiting]))
    if lost:
        lines.append(
            "  seen, then stopped heart-beating: "
            + _names([f"{c.label} (node {c.node}, last seen {_clock(beat)})" for c, beat in lost])
        )
    missing = max(0, snap.min_nodes - len(alive))
    if missing and not lost:
        lines.append(f"  never seen: {missing} node(s): no other agent of {snap.run_id!r} reached {snap.endpoint}")
    if lost:
        who = ", ".join(sorted({c.hostname for c in lost_cards}))
        why = f"the agent on {who} joined, then stopped (killed, crashed, or its node was lost)"
        if snap.round > 0:  # a restart: a node whose workers succeeded waits in torch's exit barrier, not here
            why += (
                ", or its workers succeeded and it waits in torch's exit barrier (its store client is busy there, so "
                "it stops heart-beating): torch never restarts a node whose workers succeeded"
            )
        fix = (
            f"look at the torchrun log and the kernel log (OOM killer) on {who}; restart it there, or run elastic "
            f"(--nnodes=MIN:MAX) so the job goes on without it"
        )
    elif missing:
        why = (
            f"{missing} node(s) never started torchrun, started later than join_timeout, or cannot reach "
            f"{snap.endpoint}"
        )
        fix = (
            f"start torchrun on every node within join_timeout (raise it with --rdzv-conf join_timeout=S), and run "
            f"`distinit doctor` on a missing node to check that it reaches {snap.endpoint}; see {DOCS}"
        )
    else:
        why = "enough agents published themselves but did not join this round (still starting, or restarting)"
        fix = f"raise --rdzv-conf join_timeout=S, and look at the other agents' logs; see {DOCS}"
    exc = AgentRendezvousTimeoutError("\n".join(lines), why=why, fix=fix, master=snap.endpoint, generation=snap.round)
    exc.joined = tuple(c.label for c in alive)
    exc.lost = tuple(c.label for c in lost_cards)
    return exc


def explain_closed(
    run_id: str, endpoint: str, round_: int, cards: Sequence[AgentCard], *, ended: str | None = None
) -> AgentRendezvousClosedError:
    """The closed error: another agent ended the job (its workers failed past --max-restarts, or it was stopped).

    ``ended``: the verdict line of the failure that ended the job, when the failed agent published it; it is then
    the message's first line, as that agent logged it.
    """
    failed = [card.label for card in cards if card.status == "failed"]
    named = f" ({_names(failed)} reported a failure)" if failed else ""
    closed = f"the rendezvous {run_id!r} at {endpoint} was closed while this agent waited for round {round_}{named}."
    return AgentRendezvousClosedError(
        closed if ended is None else f"{ended}\n  {closed}",
        why="another agent of the job finished or failed and closed the rendezvous (e.g. its workers failed after "
        "--max-restarts), so no further round can form",
        fix="look at the other agents' logs for the first failure; start a new job with a new --rdzv-id",
        master=endpoint,
        generation=round_,
    )


def explain_lost(
    endpoint: str, own: AgentCard, cards: Sequence[AgentCard], *, round_: int, waiting: bool
) -> AgentRendezvousConnectionError:
    """The store answered this agent, then stopped: its host agent left. Pure.

    ``cards``: the other agents' cards read while the store answered. The one that published ``store_host`` is
    named as the agent that left; every agent whose card was read came (none is ever called "never started").
    """
    hosts = [card for card in cards if card.store_host and card.label != own.label]
    doing = f"waited for round {round_}" if waiting else f"ran round {round_}"
    if hosts:
        host = _names([f"{c.label} (node {c.node}, since {_clock(c.started)})" for c in hosts])
        what = (
            f"the rendezvous store at {endpoint} stopped answering while this agent ({own.label}) {doing}: the "
            f"agent hosting it, {host}, left."
        )
        why = (
            f"the agent hosting the store ({', '.join(c.label for c in hosts)}) exited or was killed after it came: "
            "with the c10d store the job cannot outlive that agent"
        )
        where = f"on {', '.join(sorted({c.hostname for c in hosts}))}"
    else:
        what = f"the rendezvous store at {endpoint} stopped answering while this agent ({own.label}) {doing}."
        why = (
            "the agent hosting the store (on the endpoint's node) exited or was killed: with the c10d store the job "
            "cannot outlive that agent"
        )
        where = "on the endpoint's node"
    came = [c for c in cards if c not in hosts and c.label != own.label]
    if came:
        what += "\n  came before: " + _names([f"{c.label} (node {c.node})" for c in came])
    exc = AgentRendezvousConnectionError(
        what,
        why=why,
        fix=f"look at the torchrun log {where} for why it stopped; keep that node up for the whole job; see {DOCS}",
        master=endpoint,
    )
    exc.kind = "lost"
    return exc
