from __future__ import annotations

import argparse

import pytest

from distinit.watchdog._daemon import add_watchdog_parser, run_from_args


def test_serve_arguments_and_handler() -> None:
    parser = argparse.ArgumentParser()
    add_watchdog_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "watchdog",
            "serve",
            "--path",
            "/dev/shm/x",
            "--grace",
            "0.5",
            "--events",
            "e.jsonl",
            "--kill-group",
            "--no-dump-stacks",
        ]
    )
    assert args.handler is run_from_args
    assert (args.path, args.grace, args.events, args.kill_group, args.dump_stacks, args.resolution) == (
        "/dev/shm/x",
        0.5,
        "e.jsonl",
        True,
        False,
        0.02,
    )
    defaults = parser.parse_args(["watchdog", "serve"])
    assert (defaults.path, defaults.grace, defaults.events, defaults.dump_stacks) == (None, 5.0, None, True)


@pytest.mark.parametrize(
    "argv",
    [
        ["--grace", "-1"],
        ["--grace", "nan"],
        ["--grace", "inf"],
        ["--grace", "soon"],
        ["--resolution", "0"],
    ],
)
def test_bad_durations_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_watchdog_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["watchdog", "serve", *argv])
    assert caught.value.code == 2  # argparse's usage error, not a traceback
    assert "error: argument --" in capsys.readouterr().err
