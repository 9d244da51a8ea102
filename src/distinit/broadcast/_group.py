"""Who takes part in a call: the group, this rank's place in it, where collectives run, the call count."""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distinit._duration import to_seconds, to_timedelta
from distinit.broadcast import _digest, _header


class CallContext:
    """The facts one call needs: its group's, plus its own (kind, src, number, timeout). Slotted: cheap per call."""

    __slots__ = (
        "call",
        "comm_device",
        "digest",
        "global_rank",
        "group",
        "op",
        "rank",
        "scratch",
        "seq",
        "size",
        "src",
        "timeout",
        "wait_for",
    )

    def __init__(self, facts: GroupFacts, op: int, src: int, timeout: float | None, digest: bool) -> None:
        # Positional arguments, everything else read from `facts`: built on every call (hot path).
        self.group = facts.group()
        self.size = facts.size
        self.rank = facts.rank  # group-local rank of this process
        self.global_rank = facts.global_rank
        self.scratch = facts.scratch  # the group's reusable header buffers
        device = facts.device
        if facts.on_cuda:  # NCCL runs on the device current at the call, not at the first call
            device = torch.device("cuda", torch.cuda.current_device())
        self.comm_device = device  # where header and payload collectives run
        self.op = op
        self.call = _header.OP_NAMES[op]
        self.src = src
        self.seq = facts.seq
        self.timeout = timeout  # seconds, for messages; None: the process-group timeout
        self.wait_for = to_timedelta(timeout) if timeout is not None else None  # what each wait is given
        self.digest = digest  # the header travels as one all_reduce of a digest (large groups: _digest.py)

    def log_facts(self, **more: object) -> dict[str, Any]:
        """The ``extra=`` of this call's ``broadcast.call`` debug record: the call's facts and ``more``."""
        facts = {"event": "broadcast.call", "call": self.call, "seq": self.seq, "src": self.src, "rank": self.rank}
        return {"distinit": {**facts, **more}}


class GroupFacts:
    """A group's fixed facts (size, this process's ranks, the collective device) and its call counter.

    The counter gives the ``#12`` in messages and is how a skipped call is detected; it is per group
    and process-wide, as torch keeps its own.
    """

    __slots__ = ("device", "global_rank", "group", "on_cuda", "rank", "scratch", "seq", "size")

    def __init__(self, group: Any, *, size: int, rank: int, global_rank: int, device: torch.device) -> None:
        # Weakly: the group keys the cache of these facts, which must not keep it alive.
        self.group = weakref.ref(group)
        self.size, self.rank, self.global_rank, self.device = size, rank, global_rank, device
        self.seq = 0
        self.scratch: _header.Scratch | _header.GatherScratch | None = None
        if device.type == "cpu":
            self.scratch = _header.Scratch(size)
        elif torch.cuda.is_available():  # pinned host memory needs CUDA
            self.scratch = _header.GatherScratch(size)
        self.on_cuda = device.type == "cuda"

    def next_call(self, *, op: int, src: int, timeout: float | timedelta | None) -> CallContext:
        """Count one more call in this group and return its context.

        Raises:
            TypeError: ``timeout`` is not a number of seconds, a ``timedelta`` or None.
            ValueError: ``timeout`` is not a positive finite number of seconds, or
                ``DISTINIT_BROADCAST_DIGEST_FROM`` is not a number of ranks (before the call is counted).
        """
        seconds = None if timeout is None else to_seconds(timeout, "timeout")
        digest = self.size >= _digest.digest_from()  # the group size alone: every rank takes the same path
        self.seq += 1
        return CallContext(self, op, src, seconds, digest)


def resolve(group: Any) -> GroupFacts:
    """The facts of ``group`` (None: the default group), looked up once per group and cached.

    Raises:
        RuntimeError: torch.distributed is not initialised (a local precondition, same on every rank).
        ValueError: this process is not a member of ``group``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "distinit.broadcast needs an initialised process group: call torch.distributed.init_process_group "
            "(or distinit.init_with_retry) first"
        )
    pg = dist.group.WORLD if group is None else group
    facts = _FACTS.get(pg)
    if facts is None:
        facts = _group_facts(pg)
        _FACTS[pg] = facts
    return facts


# A group's backend, size and this process's ranks never change; asking torch costs ~50 µs a call,
# half of a small broadcast. Weakly keyed: a destroyed group's entry (and its call count) goes with it.
_FACTS: weakref.WeakKeyDictionary[Any, GroupFacts] = weakref.WeakKeyDictionary()


def _group_facts(pg: Any) -> GroupFacts:
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of the group it passed to distinit.broadcast; "
            "only members of `group` may call (as with torch.distributed.broadcast)"
        )
    device = comm_device(str(dist.get_backend(pg)).lower())
    return GroupFacts(pg, size=dist.get_world_size(pg), rank=rank, global_rank=dist.get_rank(), device=device)


def comm_device(backend: str) -> torch.device:
    """NCCL moves CUDA tensors on the current device; everything else goes through CPU."""
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
