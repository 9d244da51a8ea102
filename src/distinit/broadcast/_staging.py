"""Staging buckets for small tensors: the transfer plan with its buffers and views, cached by layout.

Creating thousands of views or a bucket buffer on every call costs more than copying the tensors,
so a plan keeps both between calls with the same keys, dtypes and shapes (the layout fingerprint),
within a memory budget (:data:`STAGING_BUDGET`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import torch

from distinit.broadcast import _plan
from distinit.broadcast._layout import Layout


class Staged:
    """A transfer plan plus, per bucket, a staging buffer and views shaped like its tensors.

    Keyed by the layout fingerprint, so every call with the same keys, dtypes and shapes reuses
    them: no per-call allocation of the buckets, and no per-call creation of thousands of views
    (which costs more than the copy itself). Buffers are created on first use, on the collective
    device, and dropped when the plan leaves the cache (see :data:`STAGING_BUDGET`).
    """

    def __init__(self, steps: tuple[_plan.Step, ...], tensors: Sequence[torch.Tensor]) -> None:
        self.steps = steps
        self.shapes = [tuple(tensors[i].shape for i in step.indices) if not step.direct else () for step in steps]
        self.dtypes = [tensors[step.indices[0]].dtype for step in steps]
        self.one_dim = [all(len(shape) == 1 for shape in shapes) for shapes in self.shapes]
        self.staged_bytes = sum(step.nbytes for step in steps if not step.direct)
        self._buffers: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._views: dict[tuple[int, torch.device], list[torch.Tensor]] = {}
        self.lock = threading.Lock()

    @property
    def holds_buffers(self) -> bool:
        """Whether any staging buffer is allocated."""
        return bool(self._buffers)

    def buffer(self, index: int, device: torch.device) -> torch.Tensor:
        """The flat staging tensor of bucket ``index`` (the bucket's dtype) on ``device``."""
        key = (index, device)
        buf = self._buffers.get(key)
        if buf is None:
            step = self.steps[index]
            dtype = self.dtypes[index]
            buf = torch.empty(step.nbytes // dtype.itemsize, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf

    def views(self, index: int, device: torch.device) -> list[torch.Tensor]:
        """Views into bucket ``index``'s buffer, shaped like its tensors, in order."""
        key = (index, device)
        views = self._views.get(key)
        if views is None:
            buf = self.buffer(index, device)
            shapes = self.shapes[index]
            numels = [math.prod(shape) for shape in shapes]
            views = [v.view(shape) for v, shape in zip(buf.split_with_sizes(numels), shapes, strict=True)]
            self._views[key] = views
        return views

    def drop_buffers(self) -> None:
        """Forget the staging buffers and their views (the next call allocates new ones)."""
        self._buffers, self._views = {}, {}

    def fresh(self) -> Staged:
        """A copy without buffers (used when another thread holds this one)."""
        other = Staged.__new__(Staged)
        other.__dict__.update(self.__dict__)
        other._buffers, other._views, other.lock = {}, {}, threading.Lock()
        return other


_PLANS: dict[tuple[int, int, int], Staged] = {}
MAX_PLANS = 64
STAGING_BUDGET = 256 << 20
"""Cached plans keep their staging buffers while their total stays under this many bytes (least
recently used plans drop theirs first); a plan whose buckets alone exceed it allocates per call."""


def staged_plan(lay: Layout, tensors: Sequence[torch.Tensor], bucket_bytes: int) -> Staged:
    """The transfer plan, cached by layout fingerprint: equal keys, dtypes and shapes give equal plans."""
    direct = min(_plan.DEFAULT_DIRECT_BYTES, bucket_bytes)
    key = (lay.fingerprint, bucket_bytes, direct)
    staged = _PLANS.pop(key, None)  # re-inserted below: dict order is recency
    if staged is None:
        nbytes = [t.nbytes for t in tensors]
        steps = tuple(
            _plan.plan(nbytes, bucket_bytes=bucket_bytes, direct_bytes=direct, dtypes=[t.dtype for t in tensors])
        )
        staged = Staged(steps, tensors)
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = staged
    kept = 0
    for plan in reversed(_PLANS.values()):  # newest first: older plans give their buffers back
        kept += plan.staged_bytes
        if kept > STAGING_BUDGET and plan.holds_buffers:
            plan.drop_buffers()
    if staged.staged_bytes > STAGING_BUDGET:
        return staged.fresh()
    return staged
