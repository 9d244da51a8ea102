"""Who takes part in a call: the group, this rank's place in it, and where collectives run."""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distinit.broadcast import _header


class CallContext:
    """The group facts one call needs, resolved once on entry (a slotted class: cheap per call)."""

    __slots__ = ("backend", "comm_device", "global_rank", "group", "rank", "scratch", "seq", "size", "timeout")

    def __init__(
        self,
        group: Any,
        size: int,
        rank: int,
        global_rank: int,
        backend: str,
        comm_device: torch.device,
        seq: int,
        timeout: float | None,
        scratch: _header.Scratch | None = None,
    ) -> None:
        self.group = group
        self.size = size
        self.rank = rank  # group-local rank of this process
        self.global_rank = global_rank
        self.backend = backend
        self.comm_device = comm_device  # where header and payload collectives run
        self.seq = seq
        self.timeout = timeout
        self.scratch = scratch  # the group's reusable header send buffer

    def exchange(self, words: list[int], inline: torch.Tensor | bytes | None = None) -> _header.Exchange:
        """Exchange this rank's header row within the group (see :func:`distinit.broadcast._header.exchange`).

        Raises:
            CollectiveFailed: the exchange timed out or a peer failed.
        """
        return _header.exchange(
            words, group=self.group, group_size=self.size, device=self.comm_device, inline=inline,
            timeout=self.timeout, scratch=self.scratch,
        )  # fmt: skip

    def is_src(self, src: int) -> bool:
        """Whether this rank is the (group-local) source."""
        return self.rank == src

    def global_of(self, group_rank: int) -> int:
        """The global rank of group rank ``group_rank`` (itself when the group is the world)."""
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank
        return int(dist.get_global_rank(self.group, group_rank))


class _Facts:
    """A group's fixed facts (backend, size, this process's ranks, the collective device) and its state.

    The state is the call counter (the ``#12`` in messages, and how a skipped call is detected; per
    group and process-wide, as torch keeps its own) and the reusable header send buffer.
    """

    __slots__ = ("backend", "device", "global_rank", "rank", "scratch", "seq", "size")

    def __init__(self, backend: str, size: int, rank: int, global_rank: int, device: torch.device) -> None:
        self.backend, self.size, self.rank, self.global_rank, self.device = backend, size, rank, global_rank, device
        self.seq = 0
        self.scratch = _header.Scratch(size) if device.type == "cpu" else None


def resolve(group: Any, timeout: float | timedelta | None) -> CallContext:
    """Resolve ``group`` (None: the default group) and normalise ``timeout`` to seconds.

    Raises:
        RuntimeError: torch.distributed is not initialised (a local precondition, same on every rank).
        ValueError: ``timeout`` is not positive.
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is not None and not seconds > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
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
    device = facts.device
    facts.seq += 1
    return CallContext(
        pg,
        facts.size,
        facts.rank,
        facts.global_rank,
        facts.backend,
        device if device.type != "cuda" else torch.device("cuda", torch.cuda.current_device()),
        facts.seq,
        seconds,
        facts.scratch,
    )


# A group's backend, size and this process's ranks never change; asking torch costs ~50 µs a call,
# half of a small broadcast. Weakly keyed: a destroyed group's entry (and its call count) goes with it.
_FACTS: weakref.WeakKeyDictionary[Any, _Facts] = weakref.WeakKeyDictionary()


def _group_facts(pg: Any) -> _Facts:
    backend = str(dist.get_backend(pg)).lower()
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of the group it passed to distinit.broadcast; "
            "only members of `group` may call (as with torch.distributed.broadcast)"
        )
    return _Facts(backend, dist.get_world_size(pg), rank, dist.get_rank(), comm_device(backend))


def comm_device(backend: str) -> torch.device:
    """NCCL moves CUDA tensors on the current device; everything else goes through CPU."""
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
