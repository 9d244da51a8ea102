"""Human output of a report: one line per check, the fixes for every non-pass, a verdict line."""

from __future__ import annotations

from distinit.doctor._model import ALL_IDS, Check, DoctorReport

_MARK = {"pass": "pass", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
#: Width of the id column: the longest id, so streamed lines align before the report is known.
_WIDTH = max(len(i) for i in ALL_IDS)


def verdict(report: DoctorReport) -> str:
    """``ok``, ``ok (2 warnings)`` or ``FAILED (1 failed: route; 1 warning: shm)``."""
    failed = [c.id for c in report.checks if c.status == "fail"]
    warned = [c.id for c in report.checks if c.status == "warn"]
    parts = []
    if failed:
        parts.append(f"{len(failed)} failed: {', '.join(failed)}")
    if warned:
        parts.append(f"{len(warned)} warning{'s' if len(warned) > 1 else ''}: {', '.join(warned)}")
    head = "FAILED" if failed else "ok"
    return f"{head} ({'; '.join(parts)})" if parts else head


def line(check: Check) -> str:
    """One check as one line: status, id, one-line evidence."""
    return f"  {_MARK[check.status]}  {check.id:<{_WIDTH}}  {check.summary}"


def tail(report: DoctorReport) -> str:
    """The fix of every warning and failure, then the verdict line."""
    fixes = [c for c in report.checks if c.status in ("warn", "fail") and c.fix]
    lines = ["fixes:", *(f"  {c.id}: {c.fix}" for c in fixes)] if fixes else []
    lines.append(f"verdict: {verdict(report)} in {report.elapsed_s:.2f} s")
    return "\n".join(lines)


def render(report: DoctorReport, *, title: str) -> str:
    """The whole report as text (rank 0's world report, or a rank's own when the world did not form)."""
    return "\n".join([f"distinit doctor: {title}", *(line(c) for c in report.checks), tail(report)])


def one_line(report: DoctorReport, *, host: str) -> str:
    """A non-zero rank's line once the world formed: its own warnings and failures, if any."""
    mine = report.about(report.rank)
    if not mine:
        return f"distinit doctor: rank {report.rank} ({host}): ok; rank 0 prints the world report"
    named = "; ".join(f"{c.status} {c.id}: {c.summary}" for c in mine)
    return f"distinit doctor: rank {report.rank} ({host}): {named}"
