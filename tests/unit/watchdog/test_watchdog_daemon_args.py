from __future__ import annotations

import argparse

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
