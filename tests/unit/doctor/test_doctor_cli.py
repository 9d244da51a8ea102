"""The ``doctor`` command line: options, what each rank prints, exit statuses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from distinit.doctor import Check
from distinit.doctor._cli import add_doctor_parser, output
from distinit.doctor._model import make_report


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="distinit")
    add_doctor_parser(top.add_subparsers(dest="command", required=True))
    return top


def test_options_and_their_defaults() -> None:
    args = parser().parse_args(["doctor", "--skip", "reach,clock", "--skip", "shm"])
    assert (args.json, args.timeout, args.bandwidth, args.nccl, args.no_strict) == (False, 60.0, False, False, False)
    assert parser().parse_args(["doctor", "--nccl", "--skip", "nccl"]).nccl
    assert args.skip == [("reach", "clock"), ("shm",)] and callable(args.handler)


@pytest.mark.parametrize(
    "argv", [["doctor", "--skip", "nope"], ["doctor", "--timeout", "0"], ["doctor", "--timeout", "x"]]
)
def test_bad_options_exit_two(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parser().parse_args(argv)
    assert stop.value.code == 2
    assert "distinit doctor: error" in capsys.readouterr().err


def _report(rank: int, *, formed: bool) -> object:
    checks = [
        Check(id="route", status="fail", summary="bad", fix="fix it", ranks=(1,)),
        Check(id="world", status="pass" if formed else "fail", summary="w"),
    ]
    return make_report(checks, world_size=2, rank=rank, elapsed_s=0.1)


def test_rank_zero_prints_the_world_and_others_what_names_them() -> None:
    assert output(_report(0, formed=True), as_json=False).startswith("distinit doctor: world of 2 rank(s)")  # type: ignore[arg-type]
    line = output(_report(1, formed=True), as_json=False)  # type: ignore[arg-type]
    assert line.startswith("distinit doctor: rank 1 (") and "fail route: bad" in line
    mine = json.loads(output(_report(1, formed=True), as_json=True))  # type: ignore[arg-type]
    assert [c["id"] for c in mine["checks"]] == ["route"]
    alone = json.loads(output(_report(1, formed=False), as_json=True))  # type: ignore[arg-type]
    assert [c["id"] for c in alone["checks"]] == ["route", "world"]  # no world: its whole own report


@pytest.mark.timeout(60)
def test_an_incomplete_environment_is_exit_two() -> None:
    environ = {"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore", "RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "distinit.doctor", "--json", "--timeout", "20"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    report = json.loads(done.stdout)
    env = report["checks"][0]
    assert env["id"] == "env" and env["status"] == "fail" and "IncompleteEnvError" in env["summary"]
    assert "WORLD_SIZE" in env["fix"]


def test_public_face() -> None:
    import distinit.doctor

    assert distinit.doctor.__all__ == ["Check", "DoctorReport", "Status", "run"]
    assert distinit.doctor.Check.__module__ == distinit.doctor.DoctorReport.__module__ == "distinit.doctor"
