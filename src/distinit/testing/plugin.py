"""The distinit pytest plugin (registered through the ``pytest11`` entry point).

Adds the ``distributed`` marker, the ``dist_world`` fixture and friends. Loading it costs no torch
import: everything heavy is imported when a test first uses it.
"""

from __future__ import annotations

import sys

import pytest

from distinit.testing._run import DistWorld

__all__ = ["dist_world"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ini option for the marker's default timeout."""
    parser.addini(
        "distributed_timeout",
        "default timeout in seconds of @pytest.mark.distributed tests (default 60)",
        default="60",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``distributed`` marker (so ``--strict-markers`` accepts it)."""
    from distinit.testing._marker import MARKER_HELP

    config.addinivalue_line("markers", MARKER_HELP)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the fork server early (torch imports in the background) if any test will need ranks."""
    del config
    if any(
        item.get_closest_marker("distributed") is not None or "dist_world" in getattr(item, "fixturenames", ())
        for item in items
    ):
        from distinit.testing._run import warm_up

        warm_up()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip distributed tests this machine cannot run (GPUs, NCCL), before their fixtures are set up."""
    if item.get_closest_marker("distributed") is None:
        return
    from distinit.testing._marker import options_for, skip_reason

    options = options_for(item)
    if options is not None:
        reason = skip_reason(options)
        if reason is not None:
            pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a ``@pytest.mark.distributed`` test on every rank instead of in this process."""
    if pyfuncitem.get_closest_marker("distributed") is None:
        return None
    __tracebackhide__ = True
    from distinit.testing._marker import options_for, run_marked

    options = options_for(pyfuncitem)
    if options is None:
        return None
    run_marked(pyfuncitem, options)
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop pooled rank processes (``reuse=True``) at the end of the session."""
    del session
    run = sys.modules.get("distinit.testing._run")
    if run is not None:
        run.close_pools()


@pytest.fixture
def dist_world(request: pytest.FixtureRequest) -> DistWorld:
    """A callable that runs a function on N real ranks: ``dist_world(fn, world_size=2) -> [per-rank results]``."""
    return DistWorld(request.node.nodeid)
