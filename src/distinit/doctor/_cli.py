"""``distinit doctor``: argument parsing and printing.

Rank 0 prints each check's line as it completes; every other rank prints once, at the end.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TextIO

from distinit.doctor._model import Check, DoctorReport
from distinit.doctor._render import line, one_line, render, tail
from distinit.doctor._run import run


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
            heading = "the world did not form (the checks above are this rank's; each rank prints its own line)"
            merged = check.evidence.get("merged_ranks")
            if merged:
                heading = f"the world did not form; the local checks of the {len(merged)} rank(s) that answered, merged"
            if check.status == "pass":
                heading = "the world (every rank's local checks merged, then the world checks)"
            elif check.summary.startswith("skipped"):
                heading = "the world checks"
        text = f"distinit doctor: {heading}\n{line(check)}\n" if heading else f"{line(check)}\n"
        self.stream.write(text)  # one write per check: a line never tears
        self.stream.flush()
        self.lines += 1


def output(report: DoctorReport, *, as_json: bool, streamed: bool = False) -> str:
    """What this rank prints: rank 0 its report, every other rank one line with the same verdict.

    ``--json``: rank 0 (and any rank whose world did not form) its whole report; the others the checks
    that name them. ``streamed``: the check lines were already printed as they completed; only the fixes
    and verdict follow.
    """
    formed = any(c.id == "world" and c.status == "pass" for c in report.checks)
    if as_json:
        whole = report.rank == 0 or not formed
        shown = (
            report
            if whole
            else DoctorReport.model_validate({**report.model_dump(), "checks": report.about(report.rank)})
        )
        return shown.model_dump_json()
    if streamed:
        return tail(report)
    if report.rank != 0:
        return one_line(report, host=socket.gethostname())
    scope = f"world of {report.world_size} rank(s)" if formed else f"rank 0 of {report.world_size}, no world"
    return render(report, title=scope)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the doctor as parsed by :func:`distinit.cli.add_doctor_arguments`; print; return the exit status."""
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
