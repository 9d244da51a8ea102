"""The functions a test sends to the ranks may live in test files and conftest.py, in every import mode."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)

TEST_FILE = """
import torch
import torch.distributed as dist
import pytest


def summed_rank():
    tensor = torch.tensor([dist.get_rank()])
    dist.all_reduce(tensor)
    return int(tensor)


def test_module_function(dist_world):
    assert dist_world(summed_rank, world_size=2) == [1, 1]


def test_conftest_function(dist_world, conftest_fn):
    assert dist_world(conftest_fn, world_size=2) == [2, 2]


class TestInClass:
    @staticmethod
    def helper():
        return dist.get_world_size()

    def test_staticmethod(self, dist_world):
        assert dist_world(TestInClass.helper, world_size=2) == [2, 2]


@pytest.mark.distributed(world_size=2, timeout=30)
def test_marker_body_on_each_rank(tmp_path):
    assert dist.get_world_size() == 2
    (tmp_path / f"rank{dist.get_rank()}").write_text("ok")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert int(tensor) == 2
"""

CONFTEST = """
import pytest
import torch
import torch.distributed as dist


def world_total():
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return int(tensor)


@pytest.fixture
def conftest_fn():
    return world_total
"""


@pytest.mark.parametrize(
    ("layout", "import_mode"),
    [
        pytest.param("rootdir", "prepend", id="rootdir-prepend"),
        pytest.param("package", "importlib", id="package-importlib"),
    ],
)
def test_functions_from_test_files_and_conftest(
    pytester: pytest.Pytester, plugin_args: list[str], import_mode: str, layout: str
) -> None:
    if layout == "package":
        pkg = pytester.mkpydir("tests_pkg")
        (pkg / "test_world.py").write_text(TEST_FILE)
        (pkg / "conftest.py").write_text(CONFTEST)
    else:
        pytester.makepyfile(test_world=TEST_FILE)
        pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess(*plugin_args, f"--import-mode={import_mode}", "-q", timeout=100)
    result.assert_outcomes(passed=4)
