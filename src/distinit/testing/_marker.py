"""``@pytest.mark.distributed``: run the test function itself on every rank."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import pytest

from distinit.testing._deadline import deadline_for
from distinit.testing._options import DistributedOptions

__all__ = ["call_test", "run_marked", "skip_reason"]


def skip_reason(options: DistributedOptions) -> str | None:
    """Why this machine cannot run the test (missing GPUs or NCCL), or None."""
    wants_gpu = options.gpus_per_rank > 0 or options.backend.lower() == "nccl"
    if not wants_gpu:
        return None
    import torch

    per_rank = max(options.gpus_per_rank, 1)
    needed = options.world_size * per_rank
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < needed:
        return f"needs {needed} CUDA GPU(s) (world_size={options.world_size} x gpus_per_rank={per_rank}), found {found}"
    if options.backend.lower() == "nccl":
        from torch import distributed as dist

        if not dist.is_nccl_available():
            return "backend='nccl' requested but this torch build has no NCCL"
    return None


def call_test(module_name: str, qualname: str, funcargs: dict[str, Any]) -> None:
    """Rank side: find the test function (or method, on a fresh instance) and call it."""
    __tracebackhide__ = True
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    if inspect.isclass(owner):
        owner = owner()
    func = getattr(owner, parts[-1])
    result = func(**funcargs)
    if inspect.isawaitable(result):
        raise TypeError(f"{qualname} is a coroutine function; @pytest.mark.distributed runs plain functions")


def run_marked(item: pytest.Function, options: DistributedOptions) -> None:
    """Parent side: run ``item`` on every rank, fixtures resolved here and pickled to the ranks."""
    __tracebackhide__ = True
    from distinit.testing._run import run_with_modules

    names = getattr(getattr(item, "_fixtureinfo", None), "argnames", None)
    if names is None:
        names = tuple(inspect.signature(item.obj).parameters)
    funcargs = {name: item.funcargs[name] for name in names}
    module = item.module
    if module is None:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.distributed needs a test defined in a module")
    qualname = item.obj.__qualname__
    cls = getattr(item, "cls", None)
    if cls is not None:
        qualname = f"{cls.__qualname__}.{item.obj.__name__}"
    run_with_modules(
        call_test,
        world_size=options.world_size,
        backend=options.backend,
        timeout=options.timeout,
        args=(module.__name__, qualname, funcargs),
        env=dict(options.env),
        init=options.init,
        reuse=options.reuse,
        gpus_per_rank=options.gpus_per_rank,
        label=item.nodeid,
        modules=(module,),
        deadline=deadline_for(item),
    )
