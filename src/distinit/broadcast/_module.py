"""``broadcast_module`` and ``flatten_module_``: a module's parameters and buffers, each once, in place."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

from distinit._torch import own_tensors
from distinit.broadcast import _flat, _header, _mismatch
from distinit.broadcast._group import resolve
from distinit.broadcast._layout import layout
from distinit.broadcast._state_dict import bucket_size, run
from distinit.broadcast._transport.choose import via_option


def module_tensors(model: torch.nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """Parameters then buffers, each once: tied and shared ones appear under their first name.

    Reads each module's own tensors through :func:`distinit._torch.own_tensors` (fast). The common
    case (no tied tensors, no ``None`` slots) is gathered with list operations; otherwise a
    per-tensor walk drops repeats.
    Writes go through ``torch.no_grad()``.
    """
    p_names: list[str] = []
    p_tensors: list[Any] = []
    b_names: list[str] = []
    b_tensors: list[Any] = []
    for prefix, module in model.named_modules(remove_duplicate=True):
        dotted = prefix + "." if prefix else ""
        params, buffers = own_tensors(module)
        for store, names, tensors in ((params, p_names, p_tensors), (buffers, b_names, b_tensors)):
            if store:
                names.extend([dotted + n for n in store] if dotted else store)
                tensors.extend(store.values())
    all_names, all_tensors = p_names + b_names, p_tensors + b_tensors
    if len(set(map(id, all_tensors))) == len(all_tensors) and not any(t is None for t in all_tensors):
        return all_names, all_tensors
    seen: set[int] = set()
    names_out: list[str] = []
    tensors_out: list[torch.Tensor] = []
    for name, tensor in zip(all_names, all_tensors, strict=True):
        if tensor is None or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        names_out.append(name)
        tensors_out.append(tensor)
    return names_out, tensors_out


def broadcast_module(
    model: torch.nn.Module,
    src: int = 0,
    *,
    group: Any = None,
    bucket_bytes: int | None = None,
    timeout: float | timedelta | None = None,
    via: str = "network",
    path: str | os.PathLike[str] | None = None,
    keep: bool = False,
) -> None:
    """Copy ``model``'s parameters and buffers from group rank ``src`` into every rank's model, in place.

    The structure (names, dtypes, shapes) is verified on every rank first, through one fingerprint
    in the header collective; tied and shared parameters move once. Same transfer plan as
    :func:`broadcast_state_dict`, unless every rank's model was flattened with
    :func:`flatten_module_`: then each flat buffer moves in one collective and nothing is copied.

    Args:
        model: the module on every rank (built the same way on every rank).
        src: the source rank *within* ``group``.
        group: the process group; ``None`` means the default group.
        bucket_bytes: the size cap of packed buckets (default 4 MiB).
        timeout: seconds (or a timedelta) to wait for each collective of this call.
        via: ``"network"`` (default), ``"shm"``, ``"file"`` or ``"auto"``, the same on every rank (see
            docs/broadcast.md, "Transports"); a flattened module moves zero-copy on the network only.
        path: with ``via="file"``, a directory every rank sees.
        keep: with ``via="file"``, src leaves the file in place.

    Raises:
        BroadcastMismatchError: on every rank, when the models differ in names, dtypes or shapes, or
            ranks disagree on src, call order or ``via``, or a segment or file failed.
        BroadcastTimeoutError: ``timeout`` expired or a peer died (on the waiting rank).
    """
    bucket = bucket_size(bucket_bytes)
    option = via_option(via, path=path, keep=keep)
    ctx = resolve(group).next_call(op=_header.OP_MODULE, src=src, timeout=timeout)
    flat = _flat.registered(model)
    run(ctx, module_tensors(model), status=_mismatch.OK, bucket_bytes=bucket, device=None, flat=flat, via=option)


def flatten_module_(model: torch.nn.Module) -> list[torch.Tensor]:
    """Re-home ``model``'s parameters and buffers into one flat buffer per (device, dtype), in place.

    Opt-in speed for models broadcast again and again (weight sync to actors, EMA, averaging): once
    every rank's model is flattened, :func:`broadcast_module` sends each flat buffer with one
    collective and copies nothing, instead of packing small tensors into staging buckets and sending
    large ones one by one. The structure is still verified on every call, and the result is the same
    either way. Each tensor keeps its identity (``nn.Parameter`` objects, ``requires_grad``,
    optimizer references); only its storage changes (``tensor.data = view``). Tied tensors get one
    slot. If the model changes afterwards, calls stay correct: a replaced parameter or a move to
    another device is copied through the flat buffer, and a change of dtype or shape (``.half()``)
    no longer matches the flat layout, so calls take the default path.

    Call it after moving the model to its device and before wrapping it (DDP, ``torch.compile``),
    on every rank; a rank whose model is not flattened makes every rank use the default path.

    Args:
        model: the module; tensor subclasses other than ``nn.Parameter`` (DTensor, FSDP) are refused.

    Returns:
        The flat buffers (1-d, one per device and dtype, in order of first appearance); the
        tensors are views of them.

    Raises:
        TypeError: a parameter or buffer is a tensor subclass or not strided; nothing is moved.
    """
    names, tensors = module_tensors(model)
    state = _flat.relocate(model, names, tensors, fingerprint=layout(names, tensors).fingerprint)
    return [buffer.flat for buffer in state.buffers]
