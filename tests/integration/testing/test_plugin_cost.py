"""The plugin is loaded into every pytest session: it must not import torch or start anything there."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(60)


def test_a_session_without_distributed_tests_imports_no_torch(
    pytester: pytest.Pytester, plugin_args: list[str]
) -> None:
    pytester.makepyfile(
        test_plain="""
        import multiprocessing.forkserver
        import sys


        def test_nothing_heavy_was_loaded(request):
            assert request.config.pluginmanager.has_plugin("distinit") or request.config.pluginmanager.has_plugin(
                "distinit.testing.plugin"
            )
            assert "torch" not in sys.modules
            assert multiprocessing.forkserver._forkserver._forkserver_pid is None
        """
    )
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", timeout=50)
    result.assert_outcomes(passed=1)
