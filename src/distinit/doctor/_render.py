"""Human output of a report: one line per check, the fixes for every non-pass, a verdict line.

Every line is cut at :data:`LINE_CHARS` characters (the whole text is in ``--json``), so that a long error
or a long list of ranks never floods a 512-rank log.
"""

from __future__ import annotations

from distinit.doctor._model import ALL_IDS, Check, DoctorReport

_MARK = {"pass": "pass", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
#: Width of the id column: the longest id, so streamed lines align before the report is known.
_WIDTH = max(len(i) for i in ALL_IDS)
#: The longest line the human output prints.
LINE_CHARS = 200
_MORE = " ... (--json has it all)"


def clip(text: str, width: int = LINE_CHARS) -> str:
    """``text`` on one line of at most ``width`` characters, saying where the rest is when cut."""
    flat = " ".join(text.splitlines()).rstrip()
    return flat if len(flat) <= width else flat[: width - len(_MORE)].rstrip() + _MORE


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
    return clip(f"  {_MARK[check.status]}  {check.id:<{_WIDTH}}  {check.summary}")


def tail(report: DoctorReport) -> str:
    """The fix of every warning and failure, then the verdict line."""
    fixes = [c for c in report.checks if c.status in ("warn", "fail") and c.fix]
    lines = ["fixes:", *(clip(f"  {c.id}: {c.fix}") for c in fixes)] if fixes else []
    lines.append(f"verdict: {verdict(report)} in {report.elapsed_s:.2f} s")
    return "\n".join(lines)


def render(report: DoctorReport, *, title: str) -> str:
    """The whole report as text (rank 0's world report, or a rank's own when the world did not form)."""
    return "\n".join([f"distinit doctor: {title}", *(line(c) for c in report.checks), tail(report)])


def one_line(report: DoctorReport, *, host: str) -> str:
    """A non-zero rank's one line: its report's verdict (the world's, once it formed) and its own first problem."""
    mine = report.about(report.rank)
    own = f"; here: {mine[0].status} {mine[0].id}: {mine[0].summary}" if mine else ""
    return clip(f"distinit doctor: rank {report.rank} ({host}): {verdict(report)}; rank 0 prints the report{own}")
