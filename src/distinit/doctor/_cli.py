"""``distinit doctor``: argument parsing and printing.

Rank 0 prints each check's line as it completes; every other rank prints once, at the end.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TextIO

from distinit._duration import to_seconds
from distinit.doctor._model import ALL_IDS, Check, DoctorReport
from distinit.doctor._render import line, one_line, render, tail
from distinit.doctor._run import run


def _seconds(text: str) -> float:
    try:
        return to_seconds(float(text), "S")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds > 0") from exc


def _ids(text: str) -> tuple[str, ...]:
    ids = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [i for i in ids if i not in ALL_IDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check id(s) {unknown}; the ids are {', '.join(ALL_IDS)}")
    return ids


class Progress:
    """Rank 0's human output while the doctor runs: one line per check as it completes.

    The local checks of this rank come first, under their own heading; the world's verdicts (the
    merged local checks of every rank among them) follow under the world's heading once it formed.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lines = 0

    def __call__(self, check: Check) -> None:
        heading = "local checks of this rank" if self.lines == 0 else None
        if check.id == "world":
            heading = "the world (every rank's local checks merged, then the world checks)"
        text = f"distinit doctor: {heading}\n{line(check)}\n" if heading else f"{line(check)}\n"
        self.stream.write(text)  # one write per check: a line never tears
        self.stream.flush()
        self.lines += 1


def output(report: DoctorReport, *, as_json: bool, streamed: bool = False) -> str:
    """What this rank prints: rank 0 (or any rank whose world did not form) its report, others one line.

    ``streamed``: the check lines were already printed as they completed; only the fixes and verdict follow.
    """
    if streamed and not as_json:
        return tail(report)
    formed = any(c.id == "world" and c.status == "pass" for c in report.checks)
    whole = report.rank == 0 or not formed
    if as_json:
        shown = (
            report
            if whole
            else DoctorReport.model_validate({**report.model_dump(), "checks": report.about(report.rank)})
        )
        return shown.model_dump_json()
    if not whole:
        return one_line(report, host=socket.gethostname())
    scope = f"world of {report.world_size} rank(s)" if formed else f"rank {report.rank} of {report.world_size}"
    return render(report, title=scope)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the doctor as parsed by :func:`add_doctor_parser`; print; return the exit status."""
    skip = tuple(i for group in args.skip for i in group)
    progress = None if args.json else Progress(sys.stdout)
    report = run(
        timeout=args.timeout,
        bandwidth=args.bandwidth,
        nccl=args.nccl,
        skip=skip,
        strict=not args.no_strict,
        on_check=progress,
    )
    streamed = progress is not None and progress.lines > 0
    sys.stdout.write(output(report, as_json=args.json, streamed=streamed) + "\n")
    sys.stdout.flush()
    return report.exit_status


def add_doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor`` on a CLI's subparsers; the parsed namespace's ``handler`` runs it."""
    doctor = subparsers.add_parser(
        "doctor",
        help="find what will make a distributed job hang, before it runs (run it on every rank)",
        description="Local checks on every rank, then world checks through one gloo group. "
        "Exit 0: nothing failed; 1: a check failed; 2: bad environment. See docs/doctor.md.",
    )
    add_doctor_arguments(doctor)
    doctor.set_defaults(handler=run_from_args)


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``distinit doctor`` on ``parser``."""
    parser.add_argument("--json", action="store_true", help="one JSON document per rank (rank 0: the world)")
    parser.add_argument("--timeout", type=_seconds, default=60.0, metavar="S", help="bound for everything (60 s)")
    parser.add_argument("--bandwidth", action="store_true", help="also time 64 MiB between neighbouring hosts")
    parser.add_argument("--nccl", action="store_true", help="also one small NCCL all_reduce (GPU machines)")
    parser.add_argument("--skip", type=_ids, action="append", default=[], metavar="ID,...", help="check ids not to run")
    parser.add_argument("--no-strict", action="store_true", help="treat 'not launched' as a single process")
