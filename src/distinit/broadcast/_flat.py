"""Opt-in zero-copy layout for ``broadcast_module``: a module's tensors re-homed into flat buffers.

Why: without it every call packs small tensors into staging buckets and sends large ones one
collective each. On gloo that costs 1.5-1.7x one flat broadcast of the same bytes for a
transformer-sized model and 3-4x for thousands of small tensors, where copying 2,000 separate
tensors in and out of a bucket alone costs about as much as the flat broadcast itself
(``benchmarks/bench_broadcast.py``). After :func:`relocate`, each ``(device, dtype)`` group of a
module's parameters and buffers lives back to back in one 1-d tensor, the tensors are views of it,
and a call sends each flat buffer with one collective.

The flat buffer doubles as the call's staging buffer, so the transfer is right even when a
tensor no longer aliases it (``module.to()``, ``p.data = ...``, a replaced parameter): src copies
its tensors into the buffer and receivers copy out of it with ``torch._foreach_copy_``, which is
a no-op (~0.3 µs a tensor) for a tensor that still is the view and a real copy for one that is not.
Ranks use this path only when every rank of the group has a flat state matching the call's
layout (a flag in the header row); otherwise all use the default staged path.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Sequence

import torch

from distinit.broadcast._group import CallContext
from distinit.broadcast._transport.pack import as_bytes, broadcast_bytes, copy_all, wait_or_raise


@dataclasses.dataclass(frozen=True)
class FlatBuffer:
    """One flat buffer: the tensors (by index in ``module_tensors`` order) laid out in it, in order."""

    flat: torch.Tensor  # 1-d, of one dtype, on one device
    indices: tuple[int, ...]
    views: list[torch.Tensor]  # views of ``flat`` shaped like the tensors, in ``indices`` order

    def pick(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This buffer's tensors out of the call's list (one C-level gather)."""
        if len(self.indices) == 1:
            return [tensors[self.indices[0]]]
        return list(operator.itemgetter(*self.indices)(tensors))


@dataclasses.dataclass(frozen=True)
class FlatState:
    """What :func:`relocate` made of a module: its layout fingerprint then, and its flat buffers."""

    fingerprint: int
    buffers: tuple[FlatBuffer, ...]

    def on(self, device: torch.device) -> bool:
        """Whether every flat buffer is on ``device`` (the process group's collective device)."""
        return all(buffer.flat.device == device for buffer in self.buffers)


_REGISTRY: weakref.WeakKeyDictionary[torch.nn.Module, FlatState] = weakref.WeakKeyDictionary()
"""Flattened modules, weakly: a module that goes away takes its flat buffers with it."""


def registered(module: torch.nn.Module) -> FlatState | None:
    """The flat state :func:`relocate` recorded for ``module``, if any."""
    return _REGISTRY.get(module)


def relocate(
    module: torch.nn.Module, names: Sequence[str], tensors: Sequence[torch.Tensor], *, fingerprint: int
) -> FlatState:
    """Move ``tensors`` (``module``'s, each once) into one flat buffer per ``(device, dtype)``.

    Each tensor keeps its identity (``nn.Parameter`` objects, ``requires_grad``, hooks, optimizer
    references): only what it points to changes, through ``tensor.data = view``.

    Raises:
        TypeError: a tensor is a subclass other than ``nn.Parameter`` (DTensor, FSDP's flat
            parameters manage their own storage) or is not strided; nothing is moved then.
    """
    for name, tensor in zip(names, tensors, strict=True):
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(
                f"flatten_module_: {name!r} is a {type(tensor).__name__}, which manages its own storage; "
                "only plain tensors and nn.Parameter can be re-homed (flatten the module before wrapping it)"
            )
        if tensor.layout != torch.strided:
            raise TypeError(
                f"flatten_module_: {name!r} is a {tensor.layout} tensor; only strided tensors can be re-homed"
            )
    order: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor.numel():
            order.setdefault((tensor.device, tensor.dtype), []).append(index)
    buffers = []
    with torch.no_grad():
        for (device, dtype), indices in order.items():
            numels = [tensors[i].numel() for i in indices]
            flat = torch.empty(sum(numels), dtype=dtype, device=device)
            views = [
                part.view(tensors[i].shape) for part, i in zip(flat.split_with_sizes(numels), indices, strict=True)
            ]
            for view, i in zip(views, indices, strict=True):
                view.copy_(tensors[i])
                tensors[i].data = view
            buffers.append(FlatBuffer(flat=flat, indices=tuple(indices), views=views))
    state = FlatState(fingerprint=fingerprint, buffers=tuple(buffers))
    _REGISTRY[module] = state
    return state


def transfer(ctx: CallContext, state: FlatState, tensors: Sequence[torch.Tensor], *, send: bool) -> None:
    """Move every tensor as one collective per flat buffer (all in flight at once).

    On src the tensors are first copied into the buffers and on receivers copied out afterwards;
    both are no-ops for tensors that still are views of the buffers.
    """
    with torch.no_grad():
        if send:
            for buffer in state.buffers:
                copy_all(buffer.views, buffer.pick(tensors))
        works = [broadcast_bytes(as_bytes(buffer.flat), ctx) for buffer in state.buffers]
        for work in works:
            wait_or_raise(work, ctx, "payload broadcast")
        if not send:
            for buffer in state.buffers:
                copy_all(buffer.pick(tensors), buffer.views)
