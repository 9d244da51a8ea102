"""What each agent publishes about itself on the rendezvous store, and the disagreements between agents.

An agent's card is JSON on the store (never pickle: cards come from peers): its host identity, versions, the
torchrun flags that must agree across the job, and a digest of the ``NCCL_*``/``GLOO_*``/``TORCH_*`` variables.
It is a frozen dataclass checked field by field (``_wire``), not a pydantic model: see ``_wire`` for why.
:func:`disagreements` is pure: cards in, named disagreements out, so every agent that reads the same cards
reaches the same verdict.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import platform
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from distinit._net import interfaces
from distinit.rendezvous import _wire

#: Variable prefixes whose values are digested into the card (values are never published, only hashes).
DIGESTED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
#: Store key prefix of the cards, outside torch's ``torch.rendezvous.<run_id>`` keys.
PREFIX = "distinit.torchrun"

Status = Literal["waiting", "joined", "failed"]
#: A card's heart-beat as the reader sees it: recent, old (a dead agent's card stays), or beyond clock skew.
Beat = Literal["fresh", "stale", "future"]
#: The kernel's id of this boot: two processes that read the same one run on one machine (as in ``_identity``).
BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True, kw_only=True)
class AgentCard:
    """One agent as it describes itself to the others (JSON on the store; every field checked on creation).

    Raises:
        ValueError: a field does not fit its type (a peer's malformed card).
    """

    run_id: str
    node: str  # torch's node address: --local-addr, else this host's FQDN
    pid: int
    hostname: str
    boot_id: str | None = None
    netns: int | None = None
    addresses: tuple[str, ...] = ()
    torch: str
    python: str
    distinit: str
    min_nodes: int
    max_nodes: int
    nproc_per_node: int | None = None
    max_restarts: int | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # variable -> first 12 hex digits of sha256(value)
    started: float  # wall-clock time.time() of the agent's first rendezvous
    status: Status = "waiting"
    round: int = 0
    store_host: bool = False  # this agent hosts the rendezvous store (the job ends when it leaves)

    def __post_init__(self) -> None:
        _wire.check(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> AgentCard:
        """A card as a peer published it.

        Raises:
            ValueError: not JSON, or not a valid card (a missing field, a field of the wrong type).
        """
        return _wire.from_json(cls, text)

    @classmethod
    def from_object(cls, data: object) -> AgentCard:
        """A card from a decoded JSON object (unknown keys ignored).

        Raises:
            ValueError: not a valid card.
        """
        return _wire.from_object(cls, data)

    def to_json(self) -> str:
        """The card as published on the store."""
        return _wire.to_json(self)

    def with_status(self, status: Status, round_: int) -> AgentCard:
        """This card with a new status and round (checked again, like any card)."""
        return replace(self, status=status, round=round_)

    @property
    def label(self) -> str:
        """``host pid N`` as messages name an agent."""
        return f"{self.hostname} pid {self.pid}"

    @property
    def machine(self) -> tuple[str | None, int | None, str]:
        """What makes two agents one machine: boot_id and network namespace (hostname when boot_id is unknown)."""
        return (self.boot_id, self.netns, self.hostname if self.boot_id is None else "")


def env_digest(environ: Mapping[str, str]) -> dict[str, str]:
    """Short hashes of the values of every ``NCCL_*``/``GLOO_*``/``TORCH_*`` variable (values stay private)."""
    return {
        name: hashlib.sha256(value.encode(errors="replace")).hexdigest()[:12]
        for name, value in sorted(environ.items())
        if name.startswith(DIGESTED_PREFIXES)
    }


def local_card(
    *,
    run_id: str,
    node: str,
    min_nodes: int,
    max_nodes: int,
    nproc_per_node: int | None,
    max_restarts: int | None,
    environ: Mapping[str, str] | None = None,
    store_host: bool = False,
) -> AgentCard:
    """This agent's card (a few reads from /proc, no network)."""
    import torch

    try:
        version = importlib.metadata.version("distinit")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path
        version = "unknown"

    env = os.environ if environ is None else environ
    boot_id, netns = machine()
    return AgentCard(
        run_id=run_id,
        node=node,
        pid=os.getpid(),
        hostname=socket.gethostname(),
        boot_id=boot_id,
        netns=netns,
        addresses=tuple(ip for _, ip in interfaces()),
        torch=str(torch.__version__),
        python=platform.python_version(),
        distinit=version,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc_per_node,
        max_restarts=max_restarts,
        env=env_digest(env),
        started=time.time(),
        store_host=store_host,
    )


def machine() -> tuple[str | None, int | None]:
    """``(boot_id, netns)`` of this process: the reads of ``_identity.local_identity``, without its pydantic model.

    The agent loads no pydantic (see ``_wire``); tests/unit/rendezvous/test_rendezvous_pure.py holds the two
    reads equal to ``local_identity``'s.
    """
    try:
        with open(BOOT_ID, encoding="ascii", errors="replace") as fh:
            boot_id = fh.read().strip() or None
    except OSError:
        boot_id = None
    try:
        netns: int | None = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = None
    return boot_id, netns


def launch_flags(argv: Sequence[str] | None = None) -> tuple[int | None, int | None]:
    """``(nproc_per_node, max_restarts)`` of the torchrun command that runs this agent, or Nones.

    torch passes neither to a rendezvous handler (``RendezvousParameters`` holds only the rendezvous flags), so
    they are read back from the agent's own command line with torch's own parser (which also honours the
    ``PET_*`` variables). Not torchrun (another launcher embedding the agent), or unparsable: ``None``.
    """
    if argv is None:
        program = sys.argv[0].replace(os.sep, "/") if sys.argv else ""
        if not (program.endswith("/torchrun") or program == "torchrun" or program.endswith("torch/distributed/run.py")):
            return None, None
        argv = sys.argv[1:]
    try:
        from torch.distributed.run import determine_local_world_size, get_args_parser

        parsed = get_args_parser().parse_args(list(argv))
        return int(determine_local_world_size(parsed.nproc_per_node)), int(parsed.max_restarts)
    except (SystemExit, ValueError, TypeError, AttributeError, ImportError):
        return None, None


@dataclass(frozen=True)
class Disagreement:
    """Agents that disagree on ``field``: each distinct value with the agents holding it."""

    field: str  # "--nnodes", "--nproc-per-node", "--max-restarts", "torch", "python", "distinit", "--rdzv-id"
    values: tuple[tuple[str, tuple[str, ...]], ...]  # (value, agent labels)
    fatal: bool = True

    def describe(self) -> str:
        """One line: ``--nnodes: '2' on a pid 1; '3' on b pid 2``."""
        return f"{self.field}: " + "; ".join(f"{value!r} on {', '.join(who)}" for value, who in self.values)


_FIELDS: tuple[tuple[str, str], ...] = (
    ("--nnodes", "nnodes"),
    ("--nproc-per-node", "nproc_per_node"),
    ("--max-restarts", "max_restarts"),
    ("torch", "torch"),
    ("python", "python_minor"),
    ("distinit", "distinit"),
)


def _value(card: AgentCard, key: str) -> str | None:
    if key == "nnodes":
        return f"{card.min_nodes}:{card.max_nodes}" if card.min_nodes != card.max_nodes else str(card.min_nodes)
    if key == "python_minor":
        return ".".join(card.python.split(".")[:2])
    value = getattr(card, key)
    return None if value is None else str(value)


def _split(cards: Sequence[AgentCard], key: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    groups: dict[str, list[str]] = {}
    for card in cards:
        value = _value(card, key)
        if value is not None:  # unknown (not torchrun's command line) never disagrees
            groups.setdefault(value, []).append(card.label)
    return tuple((value, tuple(sorted(who))) for value, who in sorted(groups.items()))  # one wording everywhere


def disagreements(cards: Sequence[AgentCard], *, shared_endpoint: bool = False) -> list[Disagreement]:
    """Every disagreement among ``cards`` (one job, or several jobs on one endpoint). Pure.

    Fatal: different ``--rdzv-id`` among agents still waiting (unless ``shared_endpoint``: several jobs share
    the endpoint on purpose), and, within a job, different ``--nnodes``, ``--nproc-per-node``,
    ``--max-restarts``, torch, python (major.minor) or distinit. Not fatal (a warning): different
    ``NCCL_*``/``GLOO_*``/``TORCH_*`` values (interface names may differ per node on purpose). Which cards may
    fail a round is :func:`round_cards`'s decision: any store client can write a card.
    """
    found: list[Disagreement] = []
    waiting = [card for card in cards if card.status == "waiting"]
    runs = _split(waiting, "run_id")
    if len(runs) > 1 and not shared_endpoint:
        found.append(Disagreement("--rdzv-id", runs))
    by_run: dict[str, list[AgentCard]] = {}
    for card in cards:
        by_run.setdefault(card.run_id, []).append(card)
    for run_cards in by_run.values():
        for field, key in _FIELDS:
            split = _split(run_cards, key)
            if len(split) > 1:
                found.append(Disagreement(field, split))
        names = sorted({name for card in run_cards for name in card.env})
        differing = [name for name in names if len({card.env.get(name) for card in run_cards}) > 1]
        if differing:
            found.append(
                Disagreement(
                    "environment",
                    tuple((name, tuple(c.label for c in run_cards if name in c.env)) for name in differing[:6]),
                    fatal=False,
                )
            )
    return found


def shared_machines(cards: Sequence[AgentCard]) -> list[tuple[str, ...]]:
    """Groups of agents (of one job) that run on one machine (same boot_id and network namespace). Pure."""
    groups: dict[tuple[str, tuple[str | None, int | None, str]], list[str]] = {}
    for card in cards:
        groups.setdefault((card.run_id, card.machine), []).append(card.label)
    return [tuple(labels) for labels in groups.values() if len(labels) > 1]


def claims(card: AgentCard, nodes: Sequence[str]) -> bool:
    """Whether ``card`` names one of torch's node descriptors (``addr_pid_localid``) in ``nodes``."""
    return any(node.startswith(f"{card.node}_{card.pid}_") for node in nodes)


def round_cards(
    own: AgentCard,
    others: Sequence[tuple[AgentCard, Beat]],
    participants: Sequence[str],
    *,
    formed: bool,
    waiting: Sequence[str] = (),
) -> tuple[list[AgentCard], list[AgentCard]]:
    """``(cards that may fail the round, foreign cards)``. Pure.

    Any store client can write a card, so only torch's own members count: the first list holds ``own`` and the one
    card of each other participant of torch's round (``participants``: torch's node descriptors, as torch decoded
    them). Foreign (to be reported, never a verdict): a card with a heart-beat beyond clock skew (it would never
    go stale), a card that names this agent, every card when several name one participant (which is the agent's
    own is unknowable), and, once the round ``formed``, a live card of this job that is neither a participant nor
    in torch's ``waiting`` list. Stale cards (dead agents) and live cards of other jobs or of agents not joined
    yet are neither.
    """
    mine = f"{own.node}_{own.pid}_"
    by_member: dict[str, list[AgentCard]] = {}
    foreign: list[AgentCard] = []
    for card, beat in others:
        if beat == "stale":
            continue
        member = f"{card.node}_{card.pid}_"
        if beat == "future" or member == mine:
            foreign.append(card)
        elif claims(card, participants) and card.run_id == own.run_id:
            by_member.setdefault(member, []).append(card)
        elif claims(card, participants) or (formed and card.run_id == own.run_id and not claims(card, waiting)):
            foreign.append(card)
    members = [own]
    for found in by_member.values():
        (members if len(found) == 1 else foreign).extend(found)
    return members, foreign
