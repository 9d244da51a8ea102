"""``distinit doctor``: argument parsing and printing (one write per rank, so ranks never interleave)."""

from __future__ import annotations

import argparse
import socket
import sys

from distinit._duration import to_seconds
from distinit.doctor._model import ALL_IDS, DoctorReport
from distinit.doctor._render import one_line, render
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


def output(report: DoctorReport, *, as_json: bool) -> str:
    """What this rank prints: rank 0 (or any rank whose world did not form) its report, others one line."""
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
    report = run(timeout=args.timeout, bandwidth=args.bandwidth, skip=skip, strict=not args.no_strict)
    sys.stdout.write(output(report, as_json=args.json) + "\n")
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
    parser.add_argument("--skip", type=_ids, action="append", default=[], metavar="ID,...", help="check ids not to run")
    parser.add_argument("--no-strict", action="store_true", help="treat 'not launched' as a single process")
