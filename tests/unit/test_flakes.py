"""scripts/flakes.py reads each round's JUnit report back (a real round: tests/integration/test_flakes_script.py)."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

from tests._scripts import load_script


@pytest.fixture(scope="module")
def flakes() -> ModuleType:
    return load_script("flakes")


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="tests.integration.init.test_x" name="test_ok" time="1.0"/>
<testcase classname="tests.integration.init.test_x" name="test_bad[ctrl-c]" time="2.0">
<failure message="AssertionError: rank0-0 still running after 40 s">long traceback
line 2</failure></testcase>
<testcase classname="tests.integration.init.test_x" name="test_skip" time="0.0"><skipped message="no root"/></testcase>
<testcase classname="tests.integration.init.test_x" name="test_setup_error" time="0.0">
<error message="fixture">boom</error></testcase>
</testsuite></testsuites>
"""


def test_testcases_reads_outcomes_node_ids_and_failure_text(flakes: ModuleType, tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(JUNIT)
    cases = {node: (outcome, text) for node, outcome, text in flakes._testcases(report)}
    assert cases["tests/integration/init/test_x.py::test_ok"] == ("passed", "")
    outcome, text = cases["tests/integration/init/test_x.py::test_bad[ctrl-c]"]
    assert outcome == "failed" and "still running after 40 s" in text and "line 2" in text
    assert cases["tests/integration/init/test_x.py::test_skip"][0] == "skipped"
    assert cases["tests/integration/init/test_x.py::test_setup_error"][0] == "failed"
    assert flakes._testcases(tmp_path / "missing.xml") == []  # a pass that wrote nothing: no cases


@pytest.mark.timeout(30)
def test_burners_run_for_the_block_and_are_gone_after_it() -> None:
    burning = load_script("burners").burning
    with burning(1) as pids:
        assert len(pids) == os.cpu_count()
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # killed and reaped by pid


@pytest.mark.timeout(30)
def test_burners_share_the_callers_session_so_each_weighs_one_process() -> None:
    # Under autogroup a session is a scheduling group: a burner in a session of its own would weigh as much as the
    # whole test suite (4 burners on 2 cores took 4/5 of the CPU, and the stress round missed hang guards).
    burning = load_script("burners").burning
    with burning(1) as pids:
        assert {os.getsid(pid) for pid in pids} == {os.getsid(0)}
