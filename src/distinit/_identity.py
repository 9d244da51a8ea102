"""Host identity: which ranks share a machine, and what node layout that implies.

A rank's host is what it can observe about its machine without the network: the hostname, the kernel's
``boot_id`` (NCCL's own "same host" test, with the device of ``/dev/shm``), its network namespace, and the
node name a launcher gave it. Ranks with identical identities are one host. :func:`group_ranks` is pure: it
groups ranks by identity, derives what torchrun would assign (node rank by lowest global rank, local rank,
local world size, node count) and lists every conflict with what the environment claims, naming the ranks
and the hosts, so that "every node believes it is node 0" becomes one line.

Torch-free: the standard library and pydantic only (``distinit doctor`` and ``setup()`` share it).

Reads launcher variables itself: the node name a launcher gives a task (``SLURMD_NODENAME``, ``PMI_HOSTNAME``,
Open MPI's daemon URI) is evidence of which machine this is, gathered to check the world that env resolved,
not a part of resolving it; ``distinit doctor`` reads it even where ``env_from_scheduler`` fails.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Conflict",
    "HostIdentity",
    "HostSlot",
    "NodeLayout",
    "Place",
    "RankClaim",
    "claim_of",
    "group_ranks",
    "local_identity",
    "open_mpi_node",
    "shared_gpus",
]

BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: Variables that name this task's node, innermost launcher first. MPICH's hydra proxy sets
#: MPIR_CVAR_CH3_INTERFACE_HOSTNAME to the host name it was started for (``-hosts``).
NODE_NAME_VARIABLES = (
    "SLURMD_NODENAME",
    "FLUX_NODE_NAME",
    "LSB_HOSTS_NODE",
    "PMI_HOSTNAME",
    "MPIR_CVAR_CH3_INTERFACE_HOSTNAME",
)
#: Open MPI 4 names no node, but every rank knows its orted (one per node): ``jobid.vpid;uri...``.
OMPI_DAEMON_URI = "OMPI_MCA_orte_local_daemon_uri"
#: Open MPI 4's node list, ``name,name,...@...`` (daemon vpid = index), compressed as ``pre[w:1-4]`` at scale.
OMPI_NODE_REGEX = "OMPI_MCA_orte_node_regex"
#: A launcher node name longer than this travels as its digest (names stay distinct, rows stay small).
MAX_NAME = 200


class HostIdentity(BaseModel):
    """What one process can observe about its machine. Equal identities mean one host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hostname: str
    boot_id: str | None = None
    shm_device: str | None = None  # "major:minor" of /dev/shm
    netns: int | None = None  # inode of /proc/self/ns/net
    launcher_node: str | None = None


class RankClaim(BaseModel):
    """One rank's identity with what its environment says about its place in the world."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0)
    identity: HostIdentity
    node_rank: int | None = Field(default=None, ge=0)
    local_rank: int | None = Field(default=None, ge=0)
    local_world_size: int | None = Field(default=None, ge=1)
    num_nodes: int | None = Field(default=None, ge=1)
    gpu: str | None = Field(default=None, max_length=80)  # UUID of the GPU the rank bound (NCCL), if any


class Place(Protocol):
    """Where a rank's environment puts it: what :func:`claim_of` reads (a ``distinit.env.DistEnv`` is one).

    A protocol, so this module stays free of ``env``: ``setup()`` and ``distinit doctor`` both pass their
    ``DistEnv``.
    """

    @property
    def rank(self) -> int: ...
    @property
    def node_rank(self) -> int | None: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_world_size(self) -> int | None: ...
    @property
    def num_nodes(self) -> int | None: ...


def claim_of(
    place: Place, environ: Mapping[str, str], identity: HostIdentity | None = None, *, gpu: str | None = None
) -> RankClaim:
    """This rank's row: its host identity and what its environment says about its place in the world.

    The one builder of a claim, so the claim ``setup()`` verifies the world with and the one ``distinit doctor``
    reports are the same. ``identity`` defaults to ``local_identity(environ)`` (the doctor passes the one it
    already read); ``gpu`` is the UUID of the GPU this rank bound, if any. A launcher node name longer than
    :data:`MAX_NAME` travels as its digest.
    """
    identity = local_identity(environ) if identity is None else identity
    if identity.launcher_node is not None and len(identity.launcher_node) > MAX_NAME:
        digest = hashlib.blake2b(identity.launcher_node.encode(), digest_size=16).hexdigest()
        identity = identity.model_copy(update={"launcher_node": f"{identity.launcher_node[:64]}...{digest}"})
    return RankClaim(
        rank=place.rank,
        identity=identity,
        node_rank=place.node_rank,
        local_rank=place.local_rank,
        local_world_size=place.local_world_size,
        num_nodes=place.num_nodes,
        gpu=gpu,
    )


class HostSlot(BaseModel):
    """One host of the world, as derived from identities (torchrun's assignment)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str  # the hostname, made unique among the hosts
    identity: HostIdentity
    node_rank: int
    ranks: tuple[int, ...]  # ascending; position = derived local rank


ConflictKind = Literal[
    "duplicate_rank", "node_rank_shared", "local_ranks", "local_world_size", "num_nodes", "gpu_shared"
]


class Conflict(BaseModel):
    """A disagreement between the environment's claims and the hosts the ranks really run on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ConflictKind
    message: str
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]


class NodeLayout(BaseModel):
    """The hosts of a world, derived from identities, and every conflict with what the ranks claim."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: tuple[HostSlot, ...]
    conflicts: tuple[Conflict, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.hosts)

    def host_of(self, rank: int) -> HostSlot:
        """The host of ``rank``; KeyError if the rank is not in the layout."""
        for host in self.hosts:
            if rank in host.ranks:
                return host
        raise KeyError(rank)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def open_mpi_node(environ: Mapping[str, str]) -> str | None:
    """The node Open MPI 4 placed this rank on: its orted's entry in the node list, else ``orted<vpid>``.

    Ranks of one node share one orted; two orteds on one machine (fake nodes through an rsh agent,
    containers) are two nodes to Open MPI, and so to the doctor.
    """
    uri = environ.get(OMPI_DAEMON_URI, "")
    vpid = uri.split(";", 1)[0].rpartition(".")[2]
    if not vpid.isdigit():
        return None
    listed = environ.get(OMPI_NODE_REGEX, "").split("@", 1)[0]
    names = listed.split(",") if listed and "[" not in listed else []
    return names[int(vpid)] if int(vpid) < len(names) and names[int(vpid)] else f"orted{vpid}"


def local_identity(environ: Mapping[str, str] | None = None) -> HostIdentity:
    """This process's host identity (a few reads from /proc; no network)."""
    env = os.environ if environ is None else environ
    try:
        st = os.stat("/dev/shm")
        shm: str | None = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    except OSError:
        shm = None
    try:
        netns: int | None = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = None
    node = next((env[name] for name in NODE_NAME_VARIABLES if env.get(name)), None) or open_mpi_node(env)
    return HostIdentity(
        hostname=socket.gethostname(), boot_id=_read(BOOT_ID), shm_device=shm, netns=netns, launcher_node=node
    )


def _labels(identities: Sequence[HostIdentity]) -> list[str]:
    """Hostnames, suffixed ``#2``, ``#3``... where two distinct hosts share one (containers, fake nodes)."""
    seen: dict[str, int] = {}
    labels = []
    for identity in identities:
        name = identity.launcher_node or identity.hostname
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels


def _hosts(claims: Sequence[RankClaim]) -> tuple[HostSlot, ...]:
    by_identity: dict[HostIdentity, list[int]] = {}
    for claim in sorted(claims, key=lambda c: c.rank):
        by_identity.setdefault(claim.identity, []).append(claim.rank)
    ordered = sorted(by_identity.items(), key=lambda item: item[1][0])  # torchrun: by lowest global rank
    labels = _labels([identity for identity, _ in ordered])
    return tuple(
        HostSlot(label=label, identity=identity, node_rank=index, ranks=tuple(ranks))
        for index, (label, (identity, ranks)) in enumerate(zip(labels, ordered, strict=True))
    )


def _split_by_launcher(claims: Sequence[RankClaim]) -> tuple[list[RankClaim], list[str]]:
    """Ranks of one machine that the launcher placed on several nodes are several nodes (with a note).

    Two torchrun agents on one machine (``--nnodes 2`` to try a multi-node job), or fake nodes that share
    hostname and kernel: the identities are equal, the launcher's node ranks are not; the launcher wins.
    """
    by_identity: dict[HostIdentity, set[int]] = {}
    for claim in claims:
        if claim.node_rank is not None:
            by_identity.setdefault(claim.identity, set()).add(claim.node_rank)
    split = {identity for identity, nodes in by_identity.items() if len(nodes) > 1}
    if not split:
        return list(claims), []
    refined = []
    for claim in claims:
        if claim.identity in split:
            name = claim.identity.launcher_node or claim.identity.hostname
            node = "?" if claim.node_rank is None else str(claim.node_rank)
            claim = claim.model_copy(
                update={"identity": claim.identity.model_copy(update={"launcher_node": f"{name}/node{node}"})}
            )
        refined.append(claim)
    notes = [
        f"ranks on host {identity.launcher_node or identity.hostname} are placed by the launcher on node ranks "
        f"{sorted(by_identity[identity])}: one machine, several launcher nodes (kept as the launcher says)"
        for identity in split
    ]
    return refined, notes


def _node_rank_conflicts(hosts: Sequence[HostSlot], by_rank: Mapping[int, RankClaim]) -> list[Conflict]:
    found = []
    owners: dict[int, list[HostSlot]] = {}
    for host in hosts:
        # One node rank per host at most: _split_by_launcher made hosts of the launcher's nodes.
        for node_rank in {r for r in (by_rank[rank].node_rank for rank in host.ranks) if r is not None}:
            owners.setdefault(node_rank, []).append(host)
    for node_rank, sharing in sorted(owners.items()):
        if len(sharing) > 1:
            names = tuple(h.label for h in sharing)
            ranks = tuple(sorted(r for h in sharing for r in h.ranks if by_rank[r].node_rank == node_rank))
            found.append(
                Conflict(
                    kind="node_rank_shared",
                    message=f"{len(sharing)} hosts claim node rank {node_rank}: {', '.join(names)}",
                    ranks=ranks,
                    hosts=names,
                )
            )
    return found


def _local_conflicts(host: HostSlot, by_rank: Mapping[int, RankClaim]) -> list[Conflict]:
    found = []
    claimed = [by_rank[rank].local_rank for rank in host.ranks]
    if None not in claimed and sorted(claimed) != list(range(len(host.ranks))):  # type: ignore[type-var]
        found.append(
            Conflict(
                kind="local_ranks",
                message=f"host {host.label} runs {len(host.ranks)} ranks {list(host.ranks)} with local ranks "
                f"{claimed}, expected each of 0..{len(host.ranks) - 1} once",
                ranks=host.ranks,
                hosts=(host.label,),
            )
        )
    wrong = [r for r in host.ranks if by_rank[r].local_world_size not in (None, len(host.ranks))]
    if wrong:
        sizes = sorted({by_rank[r].local_world_size for r in wrong})  # type: ignore[type-var]
        found.append(
            Conflict(
                kind="local_world_size",
                message=f"host {host.label} runs {len(host.ranks)} ranks but ranks {wrong} claim "
                f"local_world_size {sizes}",
                ranks=tuple(wrong),
                hosts=(host.label,),
            )
        )
    return found


def _num_nodes_conflict(hosts: Sequence[HostSlot], claims: Sequence[RankClaim]) -> list[Conflict]:
    wrong = sorted(c.rank for c in claims if c.num_nodes not in (None, len(hosts)))
    if not wrong:
        return []
    values = sorted({c.num_nodes for c in claims if c.num_nodes is not None})
    return [
        Conflict(
            kind="num_nodes",
            message=f"ranks run on {len(hosts)} hosts but ranks {wrong} claim num_nodes {values}",
            ranks=tuple(wrong),
            hosts=(),
        )
    ]


def _shared_kernel_notes(hosts: Sequence[HostSlot]) -> list[str]:
    kernels: dict[str, list[str]] = {}
    for host in hosts:
        if host.identity.boot_id is not None:
            kernels.setdefault(host.identity.boot_id, []).append(host.label)
    return [
        f"hosts {', '.join(labels)} share one kernel (boot_id {boot_id[:8]}...): containers or fake nodes"
        for boot_id, labels in kernels.items()
        if len(labels) > 1
    ]


def group_ranks(claims: Sequence[RankClaim]) -> NodeLayout:
    """Group ``claims`` by host identity and compare the derived layout with what the ranks claim.

    Hosts are ordered by their lowest global rank (torchrun's node rank); a host's ranks in ascending order
    give the local ranks. A rank claimed twice is reported and only its first claim is used. Ranks of one
    identity that claim several node ranks are several hosts, as the launcher says (with a note).
    """
    by_rank: dict[int, RankClaim] = {}
    conflicts: list[Conflict] = []
    for claim in claims:
        if claim.rank in by_rank:
            names = (by_rank[claim.rank].identity.hostname, claim.identity.hostname)
            conflicts.append(
                Conflict(
                    kind="duplicate_rank",
                    message=f"rank {claim.rank} is claimed twice (hosts {', '.join(names)})",
                    ranks=(claim.rank,),
                    hosts=names,
                )
            )
        else:
            by_rank[claim.rank] = claim
    unique, split_notes = _split_by_launcher(list(by_rank.values()))
    by_rank = {claim.rank: claim for claim in unique}
    hosts = _hosts(unique)
    conflicts.extend(_node_rank_conflicts(hosts, by_rank))
    for host in hosts:
        conflicts.extend(_local_conflicts(host, by_rank))
    conflicts.extend(_num_nodes_conflict(hosts, unique))
    notes = (*split_notes, *_shared_kernel_notes(hosts))
    return NodeLayout(hosts=hosts, conflicts=tuple(conflicts), notes=notes)


def shared_gpus(claims: Sequence[RankClaim]) -> tuple[Conflict, ...]:
    """Physical GPUs bound by more than one rank (by UUID), one conflict each, naming the ranks and hosts.

    A GPU UUID names one physical device whatever ``CUDA_VISIBLE_DEVICES`` renumbers, so ranks that
    bound the same UUID share a GPU (two ranks of one host with per-rank devices that overlap). Ranks
    that bound none (gloo, CPU) never conflict.
    """
    by_gpu: dict[str, list[RankClaim]] = {}
    for claim in sorted(claims, key=lambda c: c.rank):
        if claim.gpu:
            by_gpu.setdefault(claim.gpu, []).append(claim)
    found = []
    for gpu, sharing in by_gpu.items():
        if len(sharing) > 1:
            hosts = tuple(dict.fromkeys(c.identity.launcher_node or c.identity.hostname for c in sharing))
            ranks = tuple(c.rank for c in sharing)
            found.append(
                Conflict(
                    kind="gpu_shared",
                    message=f"ranks {', '.join(map(str, ranks))} (host {', '.join(hosts)}) all bound GPU {gpu}",
                    ranks=ranks,
                    hosts=hosts,
                )
            )
    return tuple(found)
