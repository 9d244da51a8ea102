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
    assert (defaults.group_window, defaults.victim_hold) == (1.0, 2.0)
    judged = parser.parse_args(["watchdog", "serve", "--group-window", "0", "--victim-hold", "0.25"])
    assert (judged.group_window, judged.victim_hold) == (0.0, 0.25)  # 0: every expiry killed alone, at once


def test_every_serve_option_reaches_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from distinit.watchdog import _daemon

    seen: dict[str, object] = {}
    monkeypatch.setattr(_daemon, "serve", lambda path, **kw: seen.update(kw, path=path) or 0)
    parser = argparse.ArgumentParser()
    add_watchdog_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            *("watchdog", "serve", "--path", "p", "--group-window", "3", "--victim-hold", "4"),
            *("--torch-fifo", "/tmp/t", "--workers-of", "4242"),
        ]
    )
    assert run_from_args(args) == 0
    assert seen == {
        "path": "p",
        "grace": 5.0,
        "events": None,
        "dump_stacks": True,
        "kill_group": False,
        "resolution": 0.02,
        "group_window": 3.0,
        "victim_hold": 4.0,
        "torch_fifo": "/tmp/t",
        "workers_of": 4242,
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["--grace", "-1"],
        ["--grace", "nan"],
        ["--grace", "inf"],
        ["--grace", "soon"],
        ["--resolution", "0"],
        ["--group-window", "-1"],
        ["--victim-hold", "inf"],
    ],
)
def test_bad_durations_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_watchdog_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["watchdog", "serve", *argv])
    assert caught.value.code == 2  # argparse's usage error, not a traceback
    assert "error: argument --" in capsys.readouterr().err
