"""What each rank did, and the one error that reports every failed rank."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

from distinit.errors import DistributedTestError

__all__ = ["RankOutcome", "build_error", "prefix_lines"]

_PHASES = {
    "start": " while starting",
    "import": " while importing the test module",
    "init": " while initialising the process group",
    "run": "",
    "return": " while returning its result",
    "teardown": " while destroying the process group",
    "exit": " while exiting (atexit handlers)",
}

#: Longest exception message shown in a one-line summary (gloo's messages run to 300+ characters).
SUMMARY_WIDTH = 160
_HARNESS_FILES = (
    os.path.join("distinit", "testing", "_child.py"),
    os.path.join("distinit", "testing", "_marker.py"),
    os.path.join("multiprocessing", ""),
    '"<string>"',
)

#: Section rulers of the report (tests match on them).
SECTION = "======== rank {rank}: {summary} ========"
STREAM = "-------- rank {rank} {name} --------"


@dataclass
class RankOutcome:
    """Everything the parent learnt about one rank of one run."""

    rank: int
    reuse: bool = False
    phase: str = "start"
    result: bytes | None = None
    error: tuple[str, str, str, str] | None = None  # phase, exception type, first line, traceback
    skip: tuple[str, str] | None = None  # ("skip" or "xfail", reason) from pytest.skip()/xfail() on the rank
    exitcode: int | None = None
    conn_closed: bool = False
    verdict: str | None = None  # set by the parent: "hung", "stopped" or "interrupted"
    failed_seq: int = 0  # order in which the parent saw ranks fail (0 = not failed)
    stdout: str = ""
    stderr: str = ""
    stack: str = ""

    def record(self, message: Any) -> None:
        """Apply one message from the rank (see ``distinit.testing._child``)."""
        if not isinstance(message, tuple) or not message:
            return
        kind = message[0]
        if kind == "phase":
            self.phase = str(message[1])
        elif kind == "ok":
            self.result = bytes(message[1])
        elif kind == "error":
            self.error = (str(message[1]), str(message[2]), str(message[3]), str(message[4]))
        elif kind in ("skip", "xfail"):
            self.skip = (str(kind), str(message[1]))

    @property
    def failed(self) -> bool:
        """The rank failed on its own (the harness stopping it is not counted here)."""
        if self.error is not None or self.skip is not None:
            return True
        if self.exitcode is None:
            return False
        return self.reuse or self.exitcode != 0 or self.result is None

    def settled(self, *, reuse: bool) -> bool:
        """Nothing more is expected from this rank."""
        if self.failed:
            return True
        return self.result is not None and (reuse or self.exitcode == 0)

    @property
    def succeeded(self) -> bool:
        return not self.failed and self.verdict is None and self.settled(reuse=self.reuse)

    def summary(self, *, timeout: float, first_failed: int | None) -> str:
        """One line: what happened to this rank."""
        where = _PHASES.get(self.phase, f" in phase {self.phase}")
        if self.error is not None:
            phase, type_name, message, _ = self.error
            where = _PHASES.get(phase, where)
            if type_name == "SystemExit":
                return f"called {message}{where}"
            if len(message) > SUMMARY_WIDTH:
                message = message[: SUMMARY_WIDTH - 3] + "..."
            consequence = ""
            if first_failed is not None and first_failed != self.rank and lost_a_peer(self):
                consequence = f" (a consequence: rank {first_failed} failed first)"
            return f"raised {type_name}{': ' + message if message else ''}{where}{consequence}"
        if self.skip is not None:
            verb = "skipped" if self.skip[0] == "skip" else "xfailed"
            return f"{verb} ({self.skip[1]}) while other ranks did not"
        if self.exitcode is not None and self.verdict is None:
            after = " after returning its result" if self.result is not None else where
            if self.exitcode < 0:
                return f"was killed by {_signal_name(-self.exitcode)} (exit code {self.exitcode}){after}"
            if self.exitcode == 0:
                return f"exited with code 0 without returning a result{where}"
            return f"exited with code {self.exitcode}{after}"
        if self.verdict == "hung" and self.phase == "start":
            return f"did not start within {timeout:g} s (an overloaded machine, or a fork server stuck importing)"
        if self.verdict == "hung":
            return f"hung{where}: still running after the {timeout:g} s timeout"
        if self.verdict == "stopped":
            cause = f" after rank {first_failed} failed" if first_failed is not None else ""
            return f"was stopped by the harness{where}{cause} (it was still running)"
        if self.verdict == "interrupted":
            return f"was stopped{where} when the test was interrupted (it was still running)"
        return "succeeded"

    def section(self, *, timeout: float, first_failed: int | None) -> str:
        """The rank's block of the report: traceback or stack, then its output prefixed by rank."""
        lines = [SECTION.format(rank=self.rank, summary=self.summary(timeout=timeout, first_failed=first_failed))]
        if self.error is not None:
            lines.append(self.error[3].rstrip("\n"))
        if self.verdict is not None:
            stack = clean_stack(self.stack)
            lines.append(f"Python stack of rank {self.rank} when it was stopped (faulthandler):")
            if stack:
                lines.append(stack)
            elif self.phase == "start":
                lines.append("(no stack: the rank had not started yet)")
            else:
                lines.append("(no stack: the rank did not answer SIGUSR1 in time)")
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                lines.append(STREAM.format(rank=self.rank, name=name))
                lines.append(prefix_lines(text, self.rank).rstrip("\n"))
        return "\n".join(lines)


def clean_stack(dump: str) -> str:
    """A faulthandler dump without the harness: no watcher thread, no frames below the test code."""
    blocks = []
    for block in dump.strip("\n").split("\n\n"):
        lines = block.splitlines()
        if any(
            "distinit-parent-watch" in line or ("_child.py" in line and line.endswith(" in watch")) for line in lines
        ):
            continue
        kept = [line for line in lines if not any(marker in line for marker in _HARNESS_FILES)]
        if kept:
            blocks.append("\n".join(kept))
    return "\n\n".join(blocks)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def prefix_lines(text: str, rank: int) -> str:
    """Prefix every line of ``text`` with ``[rank N] ``."""
    prefix = f"[rank {rank}] "
    return "".join(prefix + line for line in text.splitlines(keepends=True)) + ("" if text.endswith("\n") else "\n")


_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def lost_a_peer(outcome: RankOutcome) -> bool:
    """The rank raised because a peer's connection went away (a consequence, not a cause)."""
    return outcome.error is not None and any(text in outcome.error[2] for text in _PEER_LOSS)


def first_failed_rank(outcomes: list[RankOutcome]) -> int | None:
    """The rank whose failure probably started it all: seen first, peers' lost-connection errors last."""
    failed = [o for o in outcomes if o.failed_seq]
    if not failed:
        return None
    return min(failed, key=lambda o: (lost_a_peer(o), o.failed_seq, o.rank)).rank


def build_error(
    outcomes: list[RankOutcome], *, world_size: int, backend: str, timeout: float, label: str
) -> DistributedTestError:
    """One error for the whole run: failed ranks first (first failure first), then stopped ones."""
    first = first_failed_rank(outcomes)
    failed = [o for o in outcomes if o.failed or o.verdict == "hung"]
    failed.sort(key=lambda o: (o.rank != first, o.rank))
    stopped = [o for o in outcomes if not (o.failed or o.verdict == "hung") and o.verdict is not None]
    failures = {o.rank: o.summary(timeout=timeout, first_failed=first) for o in failed}
    where = f" in {label}" if label else ""
    if failed:
        what = f"{len(failed)} of {world_size} ranks failed{where} (backend={backend!r}, timeout={timeout:g} s)"
    else:
        what = f"the ranks were stopped{where} (backend={backend!r}, timeout={timeout:g} s)"
    lines = [what]
    lines.extend(f"  rank {o.rank} {failures[o.rank]}" for o in failed)
    lines.extend(f"  rank {o.rank} {o.summary(timeout=timeout, first_failed=first)}" for o in stopped)
    details = {o.rank: o.section(timeout=timeout, first_failed=first) for o in [*failed, *stopped]}
    why, fix = _why_fix(failed)
    return DistributedTestError(
        "\n".join(lines), failures=failures, details=details, world_size=world_size, why=why, fix=fix
    )


def _why_fix(failed: list[RankOutcome]) -> tuple[str, str]:
    if any(o.verdict == "hung" for o in failed):
        return (
            "a rank waited for a peer or a collective that never came (a rank skipped or reordered a "
            "collective, or waited on something outside the group)",
            "compare the ranks' stacks below; raise timeout= only if the test is merely slow",
        )
    if any(o.exitcode is not None and o.exitcode < 0 and o.error is None for o in failed):
        return (
            "a rank died from a signal (a native crash prints its Python stack to that rank's stderr)",
            "read the rank's stderr below; SIGKILL without a crash usually means the OOM killer or a kill",
        )
    exited = {o.exitcode for o in failed if o.error is None and o.skip is None and o.exitcode is not None}
    if exited - {0}:
        return (
            "a rank's process exited with a non-zero status (os._exit, an atexit handler, or a crash in teardown)",
            "a rank must return from the test function and exit with status 0",
        )
    if exited:
        return (
            "a rank's process exited with status 0 before finishing the test body (os._exit(0), or an "
            "exit from another thread), so it never returned a result",
            "a rank must return from the test function; do not end its process from the test",
        )
    return "", ""
