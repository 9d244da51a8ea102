"""The world's own truth: every rank's host identity, exchanged once the group exists.

The environment can only guess a node rank (Open MPI and MPICH name no node; a user's ``NODE_RANK`` may
be wrong on one machine); the ranks together know it. Right after ``init_process_group`` every rank
contributes one fixed-size row (its host identity and what its environment claims) to one ``all_gather``:
that collective replaces the old check ``all_reduce``, so success still means the fabric works, and it
costs one small collective. :func:`settle` then derives node rank, local rank, local world size and node
count from the identities (:func:`distinit._identity.group_ranks`, torchrun's assignment), fills what the
environment left unknown, and raises :class:`ConflictingEnvError` when the environment disagrees with the
world. Every rank sees the same rows, so every rank raises the same error.

Rows are JSON validated by pydantic (never pickle) with a fixed size, so a hostile or broken peer can send
garbage but cannot make this rank allocate more than ``ROW`` bytes per rank.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from pydantic import ValidationError

from distinit._duration import to_timedelta
from distinit._identity import (
    Conflict,
    HostIdentity,
    HostSlot,
    NodeLayout,
    RankClaim,
    group_ranks,
    local_identity,
    shared_gpus,
)
from distinit.env import DistEnv
from distinit.errors import ConflictingEnvError, RendezvousError

__all__ = ["ROW", "SOURCE", "claim_of", "exchange", "settle"]

#: Bytes each rank contributes: a magic, a 4-byte length, the JSON claim, zero padding.
ROW = 1024
MAGIC = b"distinit/world/1"
#: A launcher node name longer than this travels as its digest (names stay distinct, rows stay small).
MAX_NAME = 200
#: What ``DistEnv.sources`` says of a value derived from the ranks' host identities.
SOURCE = "world: host identity"


def claim_of(
    env: DistEnv, environ: Mapping[str, str], identity: HostIdentity | None = None, *, gpu: str | None = None
) -> RankClaim:
    """This rank's row: its host identity and what its environment says about its place in the world.

    ``identity`` defaults to ``local_identity(environ)`` (the doctor passes the one it already read);
    ``gpu`` is the UUID of the GPU this rank bound, if any.
    """
    identity = local_identity(environ) if identity is None else identity
    if identity.launcher_node is not None and len(identity.launcher_node) > MAX_NAME:
        digest = hashlib.blake2b(identity.launcher_node.encode(), digest_size=16).hexdigest()
        identity = identity.model_copy(update={"launcher_node": f"{identity.launcher_node[:64]}...{digest}"})
    return RankClaim(
        rank=env.rank,
        identity=identity,
        node_rank=env.node_rank,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
        num_nodes=env.num_nodes,
        gpu=gpu,
    )


def _encode(claim: RankClaim) -> bytes:
    raw = claim.model_dump_json(exclude_none=True).encode()
    if len(MAGIC) + 4 + len(raw) > ROW:  # pragma: no cover - MAX_NAME and HOST_NAME_MAX keep a claim small
        raise ValueError(f"rank {claim.rank}'s host identity is {len(raw)} bytes, over the {ROW}-byte row")
    return (MAGIC + len(raw).to_bytes(4, "little") + raw).ljust(ROW, b"\0")


def _decode(row: bytes, index: int, *, rank: int) -> RankClaim:
    """Rank ``index``'s claim from its row; a malformed row is named, never trusted."""
    size = int.from_bytes(row[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    try:
        if not row.startswith(MAGIC) or size > ROW - start:
            raise ValueError("not a distinit identity row")
        claim = RankClaim.model_validate_json(row[start : start + size])
        if claim.rank != index:
            raise ValueError(f"the row claims rank {claim.rank}")
    except (ValueError, ValidationError) as exc:
        raise RendezvousError(
            f"rank {rank}: rank {index} sent a malformed host identity row ({str(exc).splitlines()[0]})",
            rank=rank,
            why="the peer runs another distinit version, or something other than distinit joined the group.",
            fix="run the same distinit version on every rank.",
        ) from None
    return claim


def exchange(
    claim: RankClaim, *, backend: str, device_id: int | torch.device | None, world_size: int, end: float
) -> list[RankClaim]:
    """Every rank's claim, in rank order: one ``all_gather`` of ``ROW`` bytes within ``end`` (monotonic).

    Raises:
        RuntimeError: the collective did not complete in time (the fabric does not work).
        RendezvousError: a peer's row is malformed.
    """
    device: torch.device | None = None
    if isinstance(device_id, torch.device):
        device = device_id
    elif isinstance(device_id, int):
        device = torch.device("cuda", device_id)
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.frombuffer(bytearray(_encode(claim)), dtype=torch.uint8).to(device)
    rows = torch.empty(world_size * ROW, dtype=torch.uint8, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.12
    work = gather(rows, mine, async_op=True)
    if work is None or not work.wait(timeout=to_timedelta(max(end - time.monotonic(), 1.0))):
        raise RuntimeError("the identity all_gather did not complete")
    host = rows.cpu().contiguous()
    data = ctypes.string_at(host.data_ptr(), host.numel())  # not .numpy(): torch does not require numpy
    return [_decode(data[i * ROW : (i + 1) * ROW], i, rank=claim.rank) for i in range(world_size)]


def _out_of_range(layout: NodeLayout, claimed: Mapping[HostIdentity, int]) -> list[str]:
    """Node ranks claimed beyond the hosts there are (``NODE_RANK=3`` in a world of two hosts)."""
    return [
        f"host {h.label} (ranks {_span(h.ranks)}) claims node rank {claimed[h.identity]} but the ranks run on "
        f"{layout.num_nodes} hosts"
        for h in layout.hosts
        if claimed.get(h.identity, 0) >= layout.num_nodes
    ]


def _conflict_error(layout: NodeLayout, extra: Sequence[str], world_size: int) -> ConflictingEnvError:
    lines = "; ".join([*(conflict.message for conflict in layout.conflicts), *extra])
    hosts = ", ".join(f"{h.label} = ranks {_span(h.ranks)}" for h in layout.hosts)
    return ConflictingEnvError(
        f"the environment disagrees with where the {world_size} ranks really run: {lines}",
        variables=("NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        why=f"the ranks' host identities (hostname, boot_id, launcher node) say: {hosts}. Node ranks derived "
        "from a wrong NODE_RANK give two ranks the same global rank in frameworks that compute "
        "NODE_RANK * devices + LOCAL_RANK (Lightning), and put two processes on one GPU.",
        fix="unset NODE_RANK/GROUP_RANK/LOCAL_RANK/LOCAL_WORLD_SIZE where the launcher sets its own, or export "
        "the values of the hosts above (setup() derives what is left unknown).",
    )


def _shared_gpu_error(shared: Sequence[Conflict]) -> ConflictingEnvError:
    return ConflictingEnvError(
        f"two ranks bound one GPU: {'; '.join(conflict.message for conflict in shared)}",
        variables=("CUDA_VISIBLE_DEVICES", "LOCAL_RANK"),
        why="each rank binds cuda:LOCAL_RANK, or cuda:LOCAL_RANK % visible where it sees fewer GPUs than its host "
        "runs ranks (per-rank CUDA_VISIBLE_DEVICES, srun --gpus-per-task): these ranks' visible devices overlap, "
        "so they landed on one physical GPU",
        fix="give each rank a GPU of its own (srun --gpus-per-task=1 without an exported CUDA_VISIBLE_DEVICES, or "
        "unset CUDA_VISIBLE_DEVICES so every rank sees every GPU of its host), or launch fewer ranks per host",
    )


def _span(ranks: Sequence[int]) -> str:
    """``0-7`` for a run of three or more consecutive ranks, else ``0,2,4``."""
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def settle(env: DistEnv, claims: Sequence[RankClaim]) -> DistEnv:
    """``env`` with what the world knows filled in, or the conflict named (identically on every rank).

    Raises:
        ConflictingEnvError: a node rank, local rank, local world size or node count of the environment
            disagrees with the hosts the ranks run on, or two ranks bound one GPU (by UUID).
    """
    shared = shared_gpus(claims)
    if shared:
        raise _shared_gpu_error(shared)
    layout = group_ranks(claims)
    claimed = {h.identity: n for h in layout.hosts if (n := _claimed(h, claims)) is not None}
    extra = _out_of_range(layout, claimed)
    if layout.conflicts or extra:
        raise _conflict_error(layout, extra, env.world_size)
    host = layout.host_of(env.rank)
    node_ranks = _node_ranks(layout, claimed)
    derived = {
        "node_rank": node_ranks[host.label],
        "local_rank": host.ranks.index(env.rank),
        "local_world_size": len(host.ranks),
        "num_nodes": layout.num_nodes,
    }
    fields = env.model_dump()
    sources = dict(env.sources)
    for field, value in derived.items():
        if fields[field] is None:
            fields[field] = value
            sources[field] = (SOURCE,)
    fields["sources"] = sources
    fields["notes"] = (*env.notes, *layout.notes)
    return DistEnv.model_validate(fields)


def _claimed(host: HostSlot, claims: Sequence[RankClaim]) -> int | None:
    """The node rank the ranks of ``host`` claim (one, or the layout would hold a conflict), if any."""
    return next((c.node_rank for c in claims if c.rank in host.ranks and c.node_rank is not None), None)


def _node_ranks(layout: NodeLayout, claimed: Mapping[HostIdentity, int]) -> dict[str, int]:
    """Each host's node rank: the one its ranks claim, else the lowest free one in torchrun's order."""
    taken = set(claimed.values())
    free = (n for n in range(layout.num_nodes + len(taken)) if n not in taken)
    return {h.label: claimed[h.identity] if h.identity in claimed else next(free) for h in layout.hosts}
