"""Restarts under torchrun: which worker failed, and whether torch counted the restart.

torch's elastic agent hands a rendezvous handler nothing about a restart: not the failed rank, not its exit
code, not whether the restart counts against ``--max-restarts``. The agent is the caller of the handler
(``_invoke_run`` calls ``num_nodes_waiting`` and, through ``_restart_workers``, ``next_rendezvous``), so
:func:`calling_agent` reads it from the call stack: torch's ``SimpleElasticAgent`` and the ``RunResult`` its
loop holds. Only these two names are read from torch's frames; anything else (another launcher embedding a
handler) gets ``None`` and the messages say less.

The failures are JSON on the store (:class:`WorkerFailure`, never pickle; a dataclass checked by ``_wire``, which
says why it is no pydantic model), so every agent composes the same
line from the same records (:func:`restart_line`, :func:`describe_failures`, pure).

The uncounted membership change: when one node's worker fails, its agent counts a restart and re-joins; the
other agents, whose workers still look healthy, see a node waiting and restart as a *membership change*,
which torch does not count. ``TORCHELASTIC_RESTART_COUNT`` then differs between the nodes. The handler counts
that restart on the agent (:func:`count_restart`) so every node gets the same count; where it cannot (no
restart left, or no torch agent found), it names the mismatch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distinit.rendezvous import _wire
from distinit.rendezvous._torch import restart_budget, take_restart

#: How many characters of a worker's first error line are kept.
ERROR_CHARS = 200


@dataclass(frozen=True, kw_only=True)
class WorkerFailure:
    """One failed worker as its agent publishes it (JSON on the store; every field checked on creation).

    Raises:
        ValueError: a field does not fit its type (a peer's malformed record).
    """

    agent: str  # "host pid N" of its agent
    node: str  # torch's node address
    round: int
    rank: int
    local_rank: int
    pid: int
    exitcode: int  # negative: killed by signal -exitcode
    signal: str | None = None
    error: str = ""  # the first line of the worker's error (torch's error file), "" when there is none
    restart: int | None = None  # TORCHELASTIC_RESTART_COUNT of the failed worker

    def __post_init__(self) -> None:
        _wire.check(self)

    @classmethod
    def from_object(cls, data: object) -> WorkerFailure:
        """A record from a decoded JSON object, as another agent published it (unknown keys ignored).

        Raises:
            ValueError: not a valid record (a missing field, a field of the wrong type).
        """
        return _wire.from_object(cls, data)

    def to_object(self) -> dict[str, Any]:
        """The record as a JSON-ready dict."""
        return _wire.to_object(self)

    def describe(self) -> str:
        """``rank 1 (local_rank 0, pid 812) on vm pid 4711 exited with code 1: RuntimeError: boom``."""
        how = (
            f"was killed by {self.signal or f'signal {-self.exitcode}'}"
            if self.exitcode < 0
            else (f"exited with code {self.exitcode}")
        )
        head = f"rank {self.rank} (local_rank {self.local_rank}, pid {self.pid}) on {self.agent} {how}"
        if self.error:
            return f"{head}: {self.error}"
        if self.exitcode >= 0:
            return f"{head} (no error file: decorate the worker's main with torch's @record to see its error here)"
        return head


def calling_agent() -> tuple[Any | None, Any | None]:
    """``(agent, run_result)``: torch's elastic agent calling this handler and the result its loop holds.

    Either is ``None`` when not found (the handler is not called by torch's ``SimpleElasticAgent``).
    """
    from torch.distributed.elastic.agent.server.api import RunResult, SimpleElasticAgent

    agent: Any | None = None
    result: Any | None = None
    frame = sys._getframe(1)
    while frame is not None and (agent is None or result is None):
        local = frame.f_locals
        if agent is None and isinstance(local.get("self"), SimpleElasticAgent):
            agent = local["self"]
        if result is None:
            for name in ("run_result", "result"):
                if isinstance(local.get(name), RunResult):
                    result = local[name]
                    break
        frame = frame.f_back  # type: ignore[assignment]
    return agent, result


def failures_of(result: Any, *, agent: str, node: str, round_: int, restart: int | None = None) -> list[WorkerFailure]:
    """The failed workers of torch's ``RunResult`` (global rank -> ``ProcessFailure``), first error line each."""
    found = []
    for rank, failure in sorted(getattr(result, "failures", {}).items()):
        message = getattr(failure, "message", "")
        if isinstance(message, dict):
            message = message.get("message", "")
        text = str(message or "")
        if text.startswith("To enable traceback") or text.startswith("Signal "):
            text = ""  # torch's made-up text when the worker left no error file
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        exitcode = int(getattr(failure, "exitcode", 0))
        found.append(
            WorkerFailure(
                agent=agent,
                node=node,
                round=round_,
                rank=int(rank),
                local_rank=int(getattr(failure, "local_rank", -1)),
                pid=int(getattr(failure, "pid", -1)),
                exitcode=exitcode,
                signal=failure.signal_name() if exitcode < 0 else None,
                error=first[:ERROR_CHARS],
                restart=restart,
            )
        )
    return found


def restart_count(agent: Any | None) -> int | None:
    """The ``TORCHELASTIC_RESTART_COUNT`` for the agent's next workers, or ``None`` (no agent, or another torch)."""
    budget = restart_budget(agent)
    if budget is None:
        return None
    most, remaining = budget
    return most - remaining


def count_restart(agent: Any | None) -> bool:
    """Count a membership-change restart against ``--max-restarts`` as a failure restart; False if impossible."""
    return take_restart(agent)


def describe_failures(failures: Sequence[WorkerFailure]) -> str:
    """The failures, first rank first, at most three named (one wording on every agent)."""
    ordered = sorted(failures, key=lambda f: (f.rank, f.agent))
    text = "; ".join(f.describe() for f in ordered[:3])
    return text + (f"; and {len(ordered) - 3} more" if len(ordered) > 3 else "")


def restart_line(
    *,
    run_id: str,
    ended: int,
    formed: int,
    nodes: int,
    failures: Sequence[WorkerFailure],
    count: int | None,
    max_restarts: int | None,
    uncounted: bool,
) -> str:
    """The line every agent logs when a round forms after a restart. Pure."""
    cause = (
        f"the worker group failed: {describe_failures(failures)}"
        if failures
        else "a node joined or left (membership change, not counted against --max-restarts)"
    )
    counted = "?" if count is None else str(count)
    limit = "?" if max_restarts is None else str(max_restarts)
    line = (
        f"rendezvous {run_id!r}: round {ended} ended: {cause}; round {formed} formed with {nodes} node(s); "
        f"restart {counted} of --max-restarts={limit} (TORCHELASTIC_RESTART_COUNT={counted})"
    )
    if uncounted:
        line += (
            "; uncounted membership change: torch restarted this node's healthy workers without counting it, so "
            "TORCHELASTIC_RESTART_COUNT differs from the failed node's (see docs/torchrun.md#restarts)"
        )
    return line


def verdict_line(*, run_id: str, round_: int, failures: Sequence[WorkerFailure], max_restarts: int | None) -> str:
    """The verdict when a failure ends the job (no restart left). Pure.

    Logged by the failed node's agent, raised by every other agent (first line of its closed error).
    """
    counts = [f.restart for f in failures if f.restart is not None]
    after = f"restart {max(counts)}" if counts else "an unknown restart"
    limit = "?" if max_restarts is None else str(max_restarts)
    return (
        f"rendezvous {run_id!r}: round {round_} failed after {after} of --max-restarts={limit}, none left: "
        f"{describe_failures(failures)}; the job ends on every node"
    )
