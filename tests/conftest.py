"""Root conftest: only what must be declared at the top of the tree.

``pytester`` (used to test the distinit pytest plugin through real pytest sessions) can only be
enabled from the rootdir's conftest; declaring it in a sub-directory fails collection of the whole suite.

``make test`` runs the suite under pytest-xdist, then the tests of :data:`ALONE` (marked ``alone`` here)
one after another with nothing beside them.

``DISTINIT_TEST_CPU=DIR`` records what each test costs, one JSON line per test in ``DIR/cpu-<worker>.jsonl``:
its wall seconds and its CPU seconds (user + system) in the pytest process, in the processes it started and
reaped (``RUSAGE_CHILDREN``, which covers a launcher's whole reaped tree), and in the children the tests' fork
server reaped for it (:func:`tests._zygote.forked_cpu`). ``scripts/suite_cpu.py DIR`` sums them up. Daemons
kept for the session (the emulated Slurm cluster) and the fork servers' own start are not any one test's.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

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


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With ``DISTINIT_TEST_CPU`` set: one line per test with its wall and CPU seconds (see the docstring)."""
    where = os.environ.get("DISTINIT_TEST_CPU")
    if not where:
        yield
        return
    from tests._zygote import forked_cpu

    start = (time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), forked_cpu())
    yield
    end = (time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), forked_cpu())
    wall, own, children, forked = (round(b - a, 3) for a, b in zip(start, end, strict=True))
    line = {"test": item.nodeid, "wall": wall, "self": own, "children": children, "forked": forked}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(where).mkdir(parents=True, exist_ok=True)
    with (Path(where) / f"cpu-{worker}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")
