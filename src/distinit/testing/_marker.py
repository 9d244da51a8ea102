"""``@pytest.mark.distributed``: run the test function itself on every rank."""

from __future__ import annotations

import importlib
import inspect
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = [
    "MARKER",
    "TEST_STARTED",
    "DistributedOptions",
    "call_test",
    "options_for",
    "pytest_deadline",
    "run_marked",
    "skip_reason",
]

MARKER = "distributed"
MARKER_HELP = (
    "distributed(world_size=2, backend='gloo', timeout=None, gpus_per_rank=0, reuse=False, env=None, "
    "init=True): run the test function on each of world_size ranks (real processes, default process "
    "group initialised); the test fails with every failed rank's traceback, exit code or stack"
)
#: Seconds left to pytest-timeout after our own deadline, so our report (with stacks) comes first.
PYTEST_TIMEOUT_MARGIN = 3.0
DEFAULT_TIMEOUT = 60.0

#: When the test's setup began (``time.monotonic()``), stashed on items that need ranks.
TEST_STARTED = pytest.StashKey[float]()

_KNOWN = ("world_size", "backend", "timeout", "gpus_per_rank", "reuse", "env", "init")


@dataclass(frozen=True)
class DistributedOptions:
    """The marker's arguments, validated."""

    world_size: int = 2
    backend: str = "gloo"
    timeout: float = DEFAULT_TIMEOUT
    gpus_per_rank: int = 0
    reuse: bool = False
    env: tuple[tuple[str, str], ...] = ()
    init: bool = True


def options_for(item: pytest.Item) -> DistributedOptions | None:
    """Read ``@pytest.mark.distributed`` of ``item`` (None when absent); bad arguments are usage errors."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    values: dict[str, Any] = {}
    if len(marker.args) > 1:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.distributed takes at most one positional argument")
    if marker.args:
        values["world_size"] = marker.args[0]
    unknown = sorted(set(marker.kwargs) - set(_KNOWN))
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: unknown @pytest.mark.distributed argument(s) {unknown}; known: {list(_KNOWN)}"
        )
    values.update(marker.kwargs)
    world_size = values.get("world_size", 2)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise pytest.UsageError(f"{item.nodeid}: distributed(world_size=...) must be an int >= 1, got {world_size!r}")
    gpus = values.get("gpus_per_rank", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise pytest.UsageError(f"{item.nodeid}: distributed(gpus_per_rank=...) must be an int >= 0, got {gpus!r}")
    timeout = values.get("timeout")
    if timeout is None:
        timeout = float(item.config.getini("distributed_timeout") or DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise pytest.UsageError(f"{item.nodeid}: distributed(timeout=...) must be seconds > 0, got {timeout!r}")
    env = values.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise pytest.UsageError(f"{item.nodeid}: distributed(env=...) must be a dict of str to str, got {env!r}")
    return DistributedOptions(
        world_size=world_size,
        backend=str(values.get("backend", "gloo")),
        timeout=float(timeout),
        gpus_per_rank=gpus,
        reuse=bool(values.get("reuse", item.config.getini("distributed_reuse"))),
        env=tuple(sorted(env.items())),
        init=bool(values.get("init", True)),
    )


def pytest_timeout_of(item: pytest.Item) -> float | None:
    """pytest-timeout's timeout for ``item`` when that plugin is active (None: absent or off)."""
    if not item.config.pluginmanager.hasplugin("timeout"):
        return None
    try:
        import pytest_timeout  # type: ignore[import-untyped]

        settings = pytest_timeout._get_item_settings(item)
    except Exception:
        return None
    timeout = getattr(settings, "timeout", None)
    return float(timeout) if timeout else None


def pytest_deadline(item: pytest.Item) -> float | None:
    """``time.monotonic()`` by which distinit must report so pytest-timeout does not interrupt first.

    pytest-timeout's clock starts with the test's setup; the plugin stashes that moment in
    ``TEST_STARTED``. None when pytest-timeout is absent or off for this test.
    """
    outer = pytest_timeout_of(item)
    if outer is None:
        return None
    started = item.stash.get(TEST_STARTED, time.monotonic())
    return started + outer - min(PYTEST_TIMEOUT_MARGIN, outer * 0.25)


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
        options.world_size,
        options.backend,
        options.timeout,
        (module.__name__, qualname, funcargs),
        None,
        dict(options.env),
        init=options.init,
        reuse=options.reuse,
        gpus_per_rank=options.gpus_per_rank,
        label=item.nodeid,
        modules=(module,),
        deadline=pytest_deadline(item),
    )
