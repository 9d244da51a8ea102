"""Read a ``make test`` / ``.ci/run`` log into JSON: how long pytest ran, its counts, and the 20 slowest tests.

The log is read, never re-run. Three things are taken from it when present:

- pytest's final line, e.g. ``1 failed, 1797 passed, 10 skipped, 1 warning in 1295.65s (0:21:35)`` (with or
  without ``===`` around it): the seconds and every count;
- the ``slowest N durations`` block (``make test`` passes ``--durations=25``): each line
  ``51.47s setup    tests/...::test_name``, kept in the order pytest printed them (slowest first);
- wall-clock stamps: a line that is only a timestamp, or a timestamp then a label. Accepted are ``date``'s
  default output (``Fri Nov 27 02:39:33 UTC 2026``) and ISO 8601 with a ``T`` (``2026-11-27T02:39:33Z``,
  ``2026-11-27T02:39:33+00:00``; not logging's ``2026-11-27 02:39:33,123``, which tests print), optionally after
  ``===``, ``+`` or ``[``. Two or more give the wall seconds
  from the first to the last and the seconds of each phase between two stamps.

Usage: ``python scripts/suite_times.py LOG [--out benchmarks/results/suite.json]`` (without ``--out`` the JSON
goes to stdout). ``benchmarks/plot.py`` reads ``benchmarks/results/suite.json`` for issue 27's test-suite row.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

#: How many of the slowest tests the JSON keeps (issue 27 asks for the 20 slowest before and after).
SLOWEST_KEPT = 20

_FINAL = re.compile(
    r"^=*\s*(?P<counts>(?:\d+ [a-z]+(?:, )?)+) in (?P<seconds>\d+(?:\.\d+)?)s(?: \((?P<clock>[\d:]+)\))?\s*=*\s*$"
)
_COUNT = re.compile(r"(\d+) ([a-z]+)")
_SLOWEST_HEAD = re.compile(r"^=+ slowest (?:(?P<n>\d+) )?durations =+$")
_DURATION = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s\s+(?P<phase>setup|call|teardown)\s+(?P<test>\S.*?)\s*$")
_RC = re.compile(r"^rc=(?P<rc>-?\d+)\s*$")
_LEAD = r"^(?:=+\s*|\+\s*|\[)?"
_DATE_STAMP = re.compile(
    _LEAD + r"(?P<stamp>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [A-Z]{2,5} \d{4})\]?(?P<label>.*)$"
)
_ISO_STAMP = re.compile(
    _LEAD + r"(?P<stamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?(?P<label>.*)$"
)
# Plural forms as pytest prints them, folded to one key each.
_COUNT_KEYS = {"warning": "warnings", "error": "errors", "rerun": "reruns"}


def _stamp(line: str) -> tuple[datetime.datetime, str] | None:
    """The instant and label of a wall-clock stamp line, or None when ``line`` is not one."""
    if found := _DATE_STAMP.match(line):
        zone = found["stamp"].split()[4]
        when = datetime.datetime.strptime(found["stamp"].replace(f" {zone} ", " "), "%a %b %d %H:%M:%S %Y")
        when = when.replace(tzinfo=datetime.timezone.utc) if zone in ("UTC", "GMT") else when
    elif found := _ISO_STAMP.match(line):
        when = datetime.datetime.fromisoformat(found["stamp"].replace("Z", "+00:00"))
    else:
        return None
    return when, found["label"].strip(" ]:=-")


def _slowest(lines: list[str], start: int) -> list[dict[str, Any]]:
    """The duration lines that follow the ``slowest N durations`` header at ``lines[start]``."""
    rows: list[dict[str, Any]] = []
    for line in lines[start + 1 :]:
        found = _DURATION.match(line.strip())
        if found is None:
            if line.startswith("="):  # the next pytest section: the block is over
                break
            continue  # "(12 durations < 0.005s hidden ...)" and other notes inside the block
        rows.append({"seconds": float(found["seconds"]), "phase": found["phase"], "test": found["test"]})
    return rows


def parse(text: str) -> dict[str, Any]:
    """Everything ``text`` (a whole CI log) says about the test run; absent parts are None or empty.

    Args:
        text: the log, as one string.

    Returns:
        ``pytest_s`` (the seconds pytest reported, summed over ``passes`` runs, or None), ``pytest_clock`` (of a
        single pass), ``counts`` (``passed``,
        ``failed``, ``skipped``, ...), ``slowest`` (at most 20, slowest first), ``slowest_listed`` (how many the
        log listed), ``stamps``, ``wall_s`` and ``phases`` (from the wall-clock stamps) and ``rc``.
    """
    lines = text.splitlines()
    result: dict[str, Any] = dict.fromkeys(("pytest_s", "pytest_clock", "wall_s", "rc"))
    result.update(counts={}, slowest=[], slowest_listed=0, stamps=[], phases=[])
    stamps: list[tuple[datetime.datetime, str]] = []
    listed: list[dict[str, Any]] = []
    passes = 0
    for i, raw in enumerate(lines):
        line = raw.strip()
        if found := _FINAL.match(line):
            # `make test` runs pytest twice (the xdist pass, then the tests marked `alone`): the passes add up.
            passes += 1
            result["pytest_s"] = (result["pytest_s"] or 0.0) + float(found["seconds"])
            result["pytest_clock"] = found["clock"] if passes == 1 else None
            for n, word in _COUNT.findall(found["counts"]):
                key = _COUNT_KEYS.get(word, word)
                if key != "deselected":  # a test deselected by one pass runs in the other
                    result["counts"][key] = result["counts"].get(key, 0) + int(n)
        elif _SLOWEST_HEAD.match(line):
            listed.extend(_slowest(lines, i))
        elif found := _RC.match(line):
            result["rc"] = int(found["rc"])
        elif (stamp := _stamp(line)) is not None:
            stamps.append(stamp)
    result["passes"] = passes
    result["slowest_listed"] = len(listed)
    result["slowest"] = sorted(listed, key=lambda row: -row["seconds"])[:SLOWEST_KEPT]
    result["stamps"] = [{"at": when.isoformat(), "label": label} for when, label in stamps]
    if len(stamps) >= 2 and all((s[0].tzinfo is None) == (stamps[0][0].tzinfo is None) for s in stamps):
        result["wall_s"] = (stamps[-1][0] - stamps[0][0]).total_seconds()
        result["phases"] = [
            {"from": a[1] or a[0].isoformat(), "to": b[1] or b[0].isoformat(), "seconds": (b[0] - a[0]).total_seconds()}
            for a, b in itertools.pairwise(stamps)
        ]
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse the log named on the command line; write the JSON to ``--out`` or stdout. Exit 1 if no pytest line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a make test / .ci/run log")
    parser.add_argument("--out", type=Path, help="write the JSON here (e.g. benchmarks/results/suite.json)")
    args = parser.parse_args(argv)
    data = parse(args.log.read_text(errors="replace"))
    data["meta"] = {
        "command": "python scripts/suite_times.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "log": str(args.log),
        "when": data["stamps"][-1]["at"] if data["stamps"] else None,
        "derived": "read from the log named here, not measured by this script",
    }
    text = json.dumps(data, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if data["pytest_s"] is None:
        print(f"suite_times: no pytest summary line in {args.log}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
