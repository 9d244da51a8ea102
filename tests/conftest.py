"""Root conftest: only what must be declared at the top of the tree.

``pytester`` (used to test the distinit pytest plugin through real pytest sessions) can only be
enabled from the rootdir's conftest; declaring it in a sub-directory fails collection of the whole suite.

``make test`` runs the suite under pytest-xdist, then the tests of :data:`ALONE` (marked ``alone`` here)
one after another with nothing beside them.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

#: Tests that must not share the machine with other tests, by node id (a prefix covers every parameter).
ALONE = {
    # Measures which transport is faster: tests beside it change the measurement.
    "tests/integration/broadcast/test_broadcast_shm.py::test_auto_takes_shm_only_where_it_measured_faster": "timing",
    # Lists /dev/shm before and after: other tests' segments would count as left behind.
    "tests/integration/broadcast/test_shm_pool.py::test_a_killed_job_leaves_no_pooled_segment": "/dev/shm",
}


@pytest.hookimpl(tryfirst=True)  # before the -m selection reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`ALONE` ``alone``."""
    for item in items:
        if any(item.nodeid == name or item.nodeid.startswith(name + "[") for name in ALONE):
            item.add_marker(pytest.mark.alone)
