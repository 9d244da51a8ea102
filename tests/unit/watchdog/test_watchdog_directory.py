"""The default watchdog directory: per user, per job, under $XDG_RUNTIME_DIR when it is private."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distinit.watchdog._directory import default_path, job_id, private_dir_problem

UID = os.geteuid()


def test_explicit_path_wins() -> None:
    assert default_path({"DISTINIT_WATCHDOG": "/x/wd", "SLURM_JOB_ID": "7"}) == "/x/wd"


def test_per_job_names_from_the_scheduler() -> None:
    assert default_path({"SLURM_JOB_ID": "1234"}).endswith(f"/distinit-watchdog-{UID}-job-1234")
    assert default_path({"PBS_JOBID": "88.pbs01/x"}).endswith(f"/distinit-watchdog-{UID}-job-88.pbs01_x")
    assert default_path({}).endswith(f"/distinit-watchdog-{UID}")
    assert job_id({"LSB_JOBID": "  "}) is None


def test_a_private_runtime_dir_is_preferred(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o700)
    assert default_path({"XDG_RUNTIME_DIR": str(runtime), "SLURM_JOB_ID": "5"}) == str(
        runtime / f"distinit-watchdog-{UID}-job-5"
    )


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_runtime_dir_others_can_enter_is_not_used(tmp_path: Path, mode: int) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    runtime.chmod(mode)
    assert not default_path({"XDG_RUNTIME_DIR": str(runtime)}).startswith(str(runtime))
    assert not default_path({"XDG_RUNTIME_DIR": str(tmp_path / "missing")}).startswith(str(tmp_path))


def test_problems_name_the_owner_and_the_mode(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o750)
    assert "mode 750" in (private_dir_problem(str(loose)) or "")
    link = tmp_path / "link"
    link.symlink_to(loose)
    assert "not a directory" in (private_dir_problem(str(link)) or "")
    assert "does not exist" in (private_dir_problem(str(tmp_path / "nope")) or "")
    if UID == 0:
        os.chown(loose, 65534, 65534)
        assert "belongs to uid 65534" in (private_dir_problem(str(loose)) or "")
