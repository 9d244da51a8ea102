"""When distinit must report so that pytest-timeout does not interrupt a test first.

pytest-timeout's setting is read through public pytest APIs only (its marker, its ``--timeout``
option, the ``PYTEST_TIMEOUT`` variable, its ini key), with pytest-timeout's documented
precedence: marker, then option, then environment variable, then ini file. A value of 0 (or one
pytest-timeout itself would reject) means no pytest-timeout limit for us.
"""

from __future__ import annotations

import os
import time

import pytest

__all__ = ["PYTEST_TIMEOUT_MARGIN", "TEST_STARTED", "deadline_for", "outer_timeout_of"]

#: Seconds left to pytest-timeout after our own deadline, so our report (with stacks) comes first.
PYTEST_TIMEOUT_MARGIN = 3.0

#: When the test's setup began (``time.monotonic()``), stashed on items that need ranks.
TEST_STARTED = pytest.StashKey[float]()


def _marker_timeout(item: pytest.Item) -> object:
    """The ``timeout`` of ``@pytest.mark.timeout(...)`` (first positional or keyword), or None."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    if "timeout" in marker.kwargs:
        return marker.kwargs["timeout"]
    return marker.args[0] if marker.args else None


def outer_timeout_of(item: pytest.Item) -> float | None:
    """pytest-timeout's timeout for ``item`` when that plugin is active (None: absent or off)."""
    config = item.config
    if not config.pluginmanager.hasplugin("timeout"):
        return None
    value = _marker_timeout(item)
    if value is None:
        value = config.getoption("timeout", None)
    if value is None:
        value = os.environ.get("PYTEST_TIMEOUT") or None
    if value is None:
        value = config.getini("timeout") or None
    if value is None:
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        return None  # pytest-timeout reports its own bad value
    return seconds if seconds > 0 else None


def deadline_for(item: pytest.Item) -> float | None:
    """``time.monotonic()`` by which distinit must report so pytest-timeout does not interrupt first.

    pytest-timeout's clock starts with the test's setup; the plugin stashes that moment in
    ``TEST_STARTED``. None when pytest-timeout is absent or off for this test.
    """
    outer = outer_timeout_of(item)
    if outer is None:
        return None
    started = item.stash.get(TEST_STARTED, time.monotonic())
    return started + outer - min(PYTEST_TIMEOUT_MARGIN, outer * 0.25)
