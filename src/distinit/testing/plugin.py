"""The distinit pytest plugin (registered through the ``pytest11`` entry point).

Adds the ``distributed`` marker, the ``dist_world`` fixture and friends. Loading it costs no torch
import: everything heavy is imported when a test first uses it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from distinit.testing._deadline import TEST_STARTED, deadline_for
from distinit.testing._options import INI_DEFAULTS, MARKER, MARKER_HELP, DistributedOptions, options_for, read_ini
from distinit.testing._run import DistWorld
from distinit.testing._scheduler import LAUNCHER_NAMES, LAUNCHER_PREFIXES
from distinit.testing._scheduler import scheduler_env as _preset_env

__all__ = ["dist_store", "dist_world", "free_store", "scheduler_env"]

#: Each marked test's validated options, or the usage error that fails it (set at collection).
OPTIONS = pytest.StashKey["DistributedOptions | str"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ini keys ``distributed_timeout`` and ``distributed_reuse`` (the marker's defaults)."""
    # No defaults registered: an unset key is told apart from one set to the default value, so
    # each option records where its value came from (``_options``).
    parser.addini("distributed_timeout", "default timeout in seconds of @pytest.mark.distributed tests (default 60)")
    parser.addini(
        "distributed_reuse",
        "run @pytest.mark.distributed tests on pooled rank processes unless the marker says reuse=False",
        type="bool",
        default=None,
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``distributed`` marker (so ``--strict-markers`` accepts it); validate the ini keys once.

    Raises:
        pytest.UsageError: a bad ``distributed_timeout`` or ``distributed_reuse``, naming the key and value.
    """
    config.addinivalue_line("markers", MARKER_HELP)
    config.stash[INI_DEFAULTS] = read_ini(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests this machine cannot run (GPUs, NCCL) as skipped; start the fork server if ranks are needed."""
    del config
    from distinit.testing._marker import skip_reason

    needs_ranks = False
    for item in items:
        if item.get_closest_marker(MARKER) is not None:
            needs_ranks = True
            try:
                options: DistributedOptions | str = options_for(item) or DistributedOptions()
            except pytest.UsageError as exc:
                options = str(exc)  # reported when the test runs, failing only that test
            item.stash[OPTIONS] = options
            reason = skip_reason(options) if isinstance(options, DistributedOptions) else None
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
        elif "dist_world" in getattr(item, "fixturenames", ()):
            needs_ranks = True
    if needs_ranks:
        # torch is imported by the fork server in the background while the session goes on.
        from distinit.testing._supervise import warm_up

        warm_up()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Note when a test that needs ranks starts (pytest-timeout's clock starts about then)."""
    if item.get_closest_marker(MARKER) is not None or "dist_world" in getattr(item, "fixturenames", ()):
        item.stash[TEST_STARTED] = time.monotonic()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a ``@pytest.mark.distributed`` test on every rank instead of in this process."""
    if pyfuncitem.get_closest_marker(MARKER) is None:
        return None
    __tracebackhide__ = True
    from distinit.testing._marker import run_marked

    options = pyfuncitem.stash.get(OPTIONS, None)
    if options is None:  # not collected through this session's hook (e.g. added by another plugin)
        try:
            options = options_for(pyfuncitem) or DistributedOptions()
        except pytest.UsageError as exc:
            options = str(exc)
    if isinstance(options, str):
        pytest.fail(options, pytrace=False)  # fails this test only, without our internals
    run_marked(pyfuncitem, options)
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop pooled rank processes (``reuse=True``) at the end of the session."""
    del session
    pool = sys.modules.get("distinit.testing._pool")
    if pool is not None:
        pool.close_pools()


@pytest.fixture
def dist_world(request: pytest.FixtureRequest) -> DistWorld:
    """A callable that runs a function on N real ranks: ``dist_world(fn, world_size=2) -> [per-rank results]``."""
    return DistWorld(request.node.nodeid, deadline=deadline_for(request.node))


@pytest.fixture
def scheduler_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """Put a real launcher's environment into ``os.environ`` for this test (undone afterwards).

    ``scheduler_env("slurm", nodes=2, tasks_per_node=8, rank=11)`` first removes every launcher
    variable inherited from the machine (so a test run inside a real Slurm job stays
    deterministic), then sets the preset's variables and returns them. See
    :func:`distinit.testing.scheduler_env` for the layouts and options; LSF and PALS node files are
    written to ``tmp_path``.
    """

    def apply(launcher: Any, **layout: Any) -> dict[str, str]:
        if launcher in ("lsf", "pals"):
            layout.setdefault("files_dir", str(tmp_path))
        env = _preset_env(launcher, **layout)
        for name in list(os.environ):
            if name.startswith(LAUNCHER_PREFIXES) or name in LAUNCHER_NAMES:
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return env

    return apply


@pytest.fixture
def free_store() -> Iterator[Any]:
    """A ``TCPStore`` server on ``127.0.0.1``, bound to a free port and kept open (``.host``, ``.port``).

    The port is never released between choosing and using it, so clients (other processes, code
    under test joining as workers) connect without racing anyone for it.
    """
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield store
    del store


@pytest.fixture
def dist_store(tmp_path: Path) -> Iterator[Any]:
    """A ``FileStore`` in ``tmp_path`` for one process (no port at all), e.g. ``init_process_group(store=...)``."""
    from datetime import timedelta

    from torch.distributed import FileStore

    store = FileStore(str(tmp_path / "dist_store"), 1)
    store.set_timeout(timedelta(seconds=30))
    yield store
    del store
