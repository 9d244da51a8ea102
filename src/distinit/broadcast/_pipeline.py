"""Moving the tensors of one verified call: the plan's steps, with a bounded number of collectives in flight.

Buckets are packed with ``torch.cat(out=)`` (1-d tensors) or ``_foreach_copy_`` into the plan's
staging buffer and unpacked with ``_foreach_copy_`` from its views, so thousands of small tensors
cost no per-tensor Python and no per-call views; single tensors move in place. Up to
:data:`IN_FLIGHT` collectives are outstanding, so packing the next bucket overlaps sending the last.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import torch

from distinit.broadcast._group import CallContext
from distinit.broadcast._staging import Staged
from distinit.broadcast._transport.pack import as_bytes, broadcast_bytes, copy_all, copy_back, is_lazy, wait_or_raise

IN_FLIGHT = 4
"""Collectives outstanding at once. Chosen by benchmarks/bench_broadcast.py: 4 was as fast as or faster
than 1 and 2 (torch's ``_broadcast_coalesced`` uses 2) for both model shapes at world 2 and 4."""


class CopyBack:
    """Unpack received bytes into target tensors (same-dtype copies: bit-exact)."""

    def __init__(self, targets: list[torch.Tensor], sources: list[torch.Tensor], *, raw: bool = False) -> None:
        self.targets, self.sources, self.raw = targets, sources, raw  # raw: one flat uint8 source

    def __call__(self) -> None:
        with torch.no_grad():
            if self.raw:
                copy_back(self.targets[0], self.sources[0])
                return
            copy_all(self.targets, self.sources)


class Pipeline:
    """Runs one plan's steps for one call, waiting for the oldest collective once :data:`IN_FLIGHT` are out."""

    def __init__(self, ctx: CallContext, plan: Staged) -> None:
        self.ctx, self.plan = ctx, plan
        self.inflight: collections.deque[tuple[Any, CopyBack | None]] = collections.deque()

    def _push(self, work: Any, finish: CopyBack | None) -> None:
        self.inflight.append((work, finish))
        if len(self.inflight) >= IN_FLIGHT:
            self._pop()

    def _pop(self) -> None:
        work, finish = self.inflight.popleft()
        wait_or_raise(work, self.ctx, "payload broadcast")
        if finish is not None:
            finish()

    def drain(self) -> None:
        """Wait for every collective still in flight (and unpack what they received)."""
        while self.inflight:
            self._pop()

    def send(self, tensors: Sequence[torch.Tensor]) -> None:
        """Broadcast ``tensors`` (src), step by step."""
        device, plan = self.ctx.comm_device, self.plan
        with torch.no_grad():
            for index, step in enumerate(plan.steps):
                if step.direct:
                    flat = tensors[step.indices[0]].reshape(-1)
                    if flat.device != device or is_lazy(flat):
                        flat = flat.resolve_conj().resolve_neg().to(device)
                else:
                    flat = plan.buffer(index, device)
                    pack([tensors[i] for i in step.indices], flat, plan, index)
                self._push(broadcast_bytes(flat.view(torch.uint8), self.ctx), None)
            self.drain()

    def receive(self, targets: Sequence[torch.Tensor]) -> None:
        """Receive into ``targets`` (receivers), step by step."""
        device, plan = self.ctx.comm_device, self.plan
        with torch.no_grad():
            for index, step in enumerate(plan.steps):
                if step.direct:
                    target = targets[step.indices[0]]
                    if target.device == device and target.is_contiguous() and not is_lazy(target):
                        self._push(broadcast_bytes(as_bytes(target), self.ctx), None)
                        continue
                    buf = torch.empty(step.nbytes, dtype=torch.uint8, device=device)
                    self._push(broadcast_bytes(buf, self.ctx), CopyBack([target], [buf], raw=True))
                    continue
                flat = plan.buffer(index, device)
                finish = CopyBack([targets[i] for i in step.indices], plan.views(index, device))
                self._push(broadcast_bytes(flat.view(torch.uint8), self.ctx), finish)
            self.drain()


def pack(sources: list[torch.Tensor], flat: torch.Tensor, plan: Staged, index: int) -> None:
    """Copy same-dtype ``sources`` back to back into ``flat`` (bit-exact: no dtype conversion)."""
    if plan.one_dim[index]:
        try:
            torch.cat(sources, out=flat)  # one C++ call, ~2x faster than per-tensor copies
            return
        except RuntimeError:  # sources on another device than the bucket (CUDA tensors staged on gloo)
            pass
    copy_all(plan.views(index, flat.device), sources)


def run(ctx: CallContext, staged: Staged, tensors: list[torch.Tensor], *, send: bool) -> None:
    """Run the plan, holding its staging buffers (or fresh ones if another thread holds them)."""
    plan = staged if staged.lock.acquire(blocking=False) else staged.fresh()
    try:
        pipeline = Pipeline(ctx, plan)
        if send:
            pipeline.send(tensors)
        else:
            pipeline.receive(tensors)
    except BaseException:
        # A failed collective may still be writing into these buffers: never hand them to a later call.
        plan.drop_buffers()
        raise
    finally:
        if plan is staged:
            staged.lock.release()
