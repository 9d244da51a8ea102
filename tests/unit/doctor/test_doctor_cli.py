"""The ``doctor`` command line: options, what each rank prints, exit statuses.

Pure: ``python -m distinit.doctor`` run in a fresh process is tested in
``tests/integration/doctor/test_doctor_cli_process.py``.
"""

from __future__ import annotations

import argparse
import json

import pytest

from distinit.cli import DOCTOR_IDS, build_parser
from distinit.doctor import Check
from distinit.doctor._cli import output
from distinit.doctor._model import ALL_IDS, make_report
from distinit.doctor._render import LINE_CHARS


def parser() -> argparse.ArgumentParser:
    return build_parser(["doctor"])


def test_the_cli_spells_the_same_check_ids_as_the_doctor() -> None:
    assert DOCTOR_IDS == ALL_IDS


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


def test_rank_zero_prints_the_world_and_others_one_line_with_its_verdict() -> None:
    assert output(_report(0, formed=True), as_json=False).startswith("distinit doctor: world of 2 rank(s)")  # type: ignore[arg-type]
    line = output(_report(1, formed=True), as_json=False)  # type: ignore[arg-type]
    assert line.startswith("distinit doctor: rank 1 (") and "FAILED (1 failed: route)" in line
    assert "fail route: bad" in line and "\n" not in line
    mine = json.loads(output(_report(1, formed=True), as_json=True))  # type: ignore[arg-type]
    assert [c["id"] for c in mine["checks"]] == ["route"]
    alone = json.loads(output(_report(1, formed=False), as_json=True))  # type: ignore[arg-type]
    assert [c["id"] for c in alone["checks"]] == ["route", "world"]  # no world: its whole own report
    unformed = output(_report(1, formed=False), as_json=False)  # type: ignore[arg-type]
    assert "\n" not in unformed and "FAILED (2 failed: route, world)" in unformed


def test_a_rank_never_prints_ok_when_the_world_failed() -> None:
    checks = [Check(id="world", status="pass", summary="w"), Check(id="nodes", status="fail", summary="x", ranks=(0,))]
    line = output(make_report(checks, world_size=4, rank=3, elapsed_s=0.1), as_json=False)
    assert "FAILED (1 failed: nodes)" in line and " ok" not in line


def test_human_lines_are_capped_and_json_keeps_everything() -> None:
    long = "x" * 1600
    checks = [Check(id="route", status="fail", summary=long, fix=long), Check(id="world", status="skip", summary="w")]
    report = make_report(checks, world_size=1, rank=0, elapsed_s=0.1)
    text = output(report, as_json=False)
    assert max(len(line) for line in text.splitlines()) <= LINE_CHARS
    assert "--json has it all" in text
    assert json.loads(output(report, as_json=True))["checks"][0]["summary"] == long


def test_public_face() -> None:
    import distinit.doctor

    assert distinit.doctor.__all__ == ["Check", "DoctorReport", "Status", "run"]
    assert distinit.doctor.Check.__module__ == distinit.doctor.DoctorReport.__module__ == "distinit.doctor"
