"""Moving a verified call's payload by the transport every rank agreed on (``via=``): shm, file, or network."""

from __future__ import annotations

import torch

from distinit.broadcast import _file, _shm
from distinit.broadcast._group import CallContext
from distinit.broadcast._via import Spec, Via, agree, slots


def move(
    ctx: CallContext,
    via: Via,
    spec: Spec,
    names: list[str],
    sources: list[torch.Tensor] | None,
    outs: list[torch.Tensor | None],
) -> list[torch.Tensor] | None:
    """This rank's tensors, moved through shared memory or a file; ``None`` when the route is the network.

    Runs on every rank of a call whose verdict passed and whose ranks all passed ``via`` (not "network").
    ``spec`` is the call's (dtype, shape) list, the same on every rank; ``sources`` src's tensors;
    ``outs`` a receiver's buffers (``None`` entries: allocate, or view shared pages with ``zero_copy``).
    """
    route = agree(ctx, via, slots(spec)[1])
    if route.kind == "shm":
        return _shm.transfer(ctx, route, spec, sources, outs, via.zero_copy)
    if route.kind == "file":
        return _file.transfer(ctx, route, via, spec, names, sources, outs)
    return None
