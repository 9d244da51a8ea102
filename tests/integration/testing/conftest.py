"""Shared helpers for the distinit.testing integration tests (real processes, real pytest sessions)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

# pytester is enabled in the root tests/conftest.py (pytest only allows pytest_plugins there).


def _entry_point_installed() -> bool:
    return any(ep.value == "distinit.testing.plugin" for ep in entry_points(group="pytest11"))


@pytest.fixture
def plugin_args() -> list[str]:
    """Arguments that load the distinit plugin in an inner session (explicitly when not pip-installed)."""
    return [] if _entry_point_installed() else ["-p", "distinit.testing.plugin"]
