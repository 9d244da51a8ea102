"""The skip/fail policy of the launcher tests: skip for contributors, fail in CI (CI=true)."""

from __future__ import annotations

import os

import launch_support
import pytest


@pytest.mark.timeout(10)
def test_not_root_skips_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(launch_support, "_which", lambda name: True)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        launch_support.require(["slurm"])


@pytest.mark.timeout(10)
def test_not_root_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(launch_support, "_which", lambda name: True)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        launch_support.require(["slurm"])


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_missing_binary_names_it_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(launch_support, "_which", lambda name: name != "mpiexec.hydra")
    with pytest.raises(outcome, match=r"mpich launcher not installed \(missing mpiexec.hydra\).*make system"):
        launch_support.require(["mpich"])
