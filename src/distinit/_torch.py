"""The private torch internals that init and broadcast read, each feature-detected with a public fallback.

It also holds the one public call whose keywords differ between supported torches (:func:`peer`).

A leaf: it imports torch and nothing of ours. The rendezvous package has its own seam
(``rendezvous/_torch.py``); ``tests/unit/test_torch_seam.py`` fails when a private torch name appears anywhere
else. Every fallback is slower or less precise, never wrong and never a crash.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist


def default_store() -> dist.Store | None:
    """The default process group's store (``distributed_c10d._get_default_store``), or ``None``.

    ``None`` when no group is formed or this torch has no such function: liveness is then not watched.
    """
    get: Callable[[], dist.Store] | None = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get is None or not dist.is_initialized():
        return None
    return get()


def pg_timeout_setter() -> Callable[[timedelta], None] | None:
    """Torch's private ``_set_pg_timeout`` (the default group's collective timeout, set after it formed), or None."""
    setter: Callable[[timedelta], None] | None = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    return setter


def reset_group_counter() -> bool:
    """Undo torch's leaked group counter after a failed init (pytorch/pytorch#46561).

    ``init_process_group`` bumps the private ``_world.group_count`` before anything can fail and never
    rolls it back, so a retry in the same process uses ``default_pg/1`` keys while fresh peers use
    ``default_pg/0``: they never meet. Feature-detected: returns False when the attribute is absent or
    when process groups still exist (then the counter is in use and must not be touched).
    """
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is None or not isinstance(getattr(world, "group_count", None), int):
        return False
    if getattr(world, "pg_map", None) or world.group_count == 0:
        return False
    world.group_count = 0
    return True


def foreach_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy ``src[i]`` into ``dst[i]``: one ``torch._foreach_copy_`` where it exists and applies, else one each."""
    many: Callable[[list[torch.Tensor], list[torch.Tensor]], None] | None = getattr(torch, "_foreach_copy_", None)
    if many is not None:
        try:
            many(dst, src)
            return
        except RuntimeError:  # mixed devices on an older torch
            pass
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


def own_tensors(module: torch.nn.Module) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """A module's own parameters and buffers (not its children's), ``None`` slots included.

    Reads ``_parameters``/``_buffers``: ``named_parameters()`` plus ``detach()`` cost ~10 µs per tensor, which
    dominates a 2000-tensor model. Where they are missing, the public ``named_*(recurse=False)`` (no ``None``).
    """
    params = getattr(module, "_parameters", None)
    buffers = getattr(module, "_buffers", None)
    if isinstance(params, Mapping) and isinstance(buffers, Mapping):
        return params, buffers
    return dict(module.named_parameters(recurse=False)), dict(module.named_buffers(recurse=False))


def collective_counts(limit: int = 16) -> dict[str, int]:
    """How many collectives this rank issued per process group it belongs to: ``{"world": n, "<group name>": m}``.

    Read from the private ``_world.pg_names`` and each group's ``_get_sequence_number_for_group()`` (a counter
    torch bumps when a collective or point-to-point op is issued on the group; cheap, no lock, safe from another
    thread). At most ``limit`` groups. Empty where this torch has neither, or no group is formed: the hang
    verdict then has no collective numbers and judges from where each rank is.
    """
    if not dist.is_initialized():
        return {}
    world = getattr(dist.distributed_c10d, "_world", None)
    names = getattr(world, "pg_names", None)
    if not isinstance(names, Mapping):
        return {}
    default = dist.group.WORLD
    counts: dict[str, int] = {}
    for group, name in list(names.items())[:limit]:
        count = getattr(group, "_get_sequence_number_for_group", None)
        if count is None:
            continue
        try:
            value = count()
        except RuntimeError:  # a group being destroyed, or a backend without a counter
            continue
        if isinstance(value, int):
            counts["world" if group is default else str(name)] = value
    return counts


def group_name(group: object) -> str | None:
    """The name :func:`collective_counts` gives ``group``, a collective's ``group`` argument.

    ``"world"`` for None or the default group, else its name in ``_world.pg_names``; None when it is neither.
    """
    if group is None or group is dist.group.WORLD:
        return "world"
    names = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_names", None)
    if not isinstance(names, Mapping):
        return None
    try:
        name = names.get(group)
    except TypeError:  # an unhashable argument
        return None
    return None if name is None else str(name)


@functools.cache
def _takes(function: str, parameter: str) -> bool:
    """Whether ``torch.distributed.<function>`` has a keyword ``parameter`` (read once per process)."""
    try:
        return parameter in inspect.signature(getattr(dist, function)).parameters
    except (AttributeError, TypeError, ValueError):  # no such function, or no signature to read
        return False


def peer(function: str, role: Literal["src", "dst"], rank: int, group: Any) -> dict[str, int]:
    """The keyword that names group-local ``rank`` as ``role`` of ``torch.distributed.<function>``.

    ``group_src``/``group_dst`` (a rank within ``group``) where this torch takes them (torch 2.6 added them to
    ``broadcast``, ``isend`` and ``irecv``); else ``src``/``dst`` with the global rank, as older torches take
    (``get_global_rank``; the default group's ranks are global already). Public names only: the same call on
    every torch instead of ``TypeError: broadcast() got an unexpected keyword argument 'group_src'``.
    """
    if _takes(function, f"group_{role}"):
        return {f"group_{role}": rank}
    return {role: rank if group is None or group is dist.GroupMember.WORLD else dist.get_global_rank(group, rank)}
