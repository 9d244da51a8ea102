"""The doctor's results: one ``Check`` per check id and a ``DoctorReport``; ``--json`` is their dump."""

# No `from __future__ import annotations`: the models name `distinit.doctor` as their module, so pydantic
# must see real types now, not strings it would resolve there.

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from distinit.errors import DistinitError

#: The verdict of one doctor check (:class:`Check`): passed, a warning, failed, or skipped (its summary says why).
Status = Literal["pass", "warn", "fail", "skip"]

#: Exit statuses of ``distinit doctor`` (as ``distinit env``: 2 is a bad environment).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_ENV = 2

#: Local checks (each rank, no network) then world checks (through one gloo group), in report order.
LOCAL_IDS = ("env", "limits", "shm", "host", "names", "route", "gpu")
WORLD_IDS = ("world", "consensus", "clock", "nodes", "reach", "bandwidth", "nccl")
ALL_IDS = LOCAL_IDS + WORLD_IDS

_SEVERITY: dict[str, int] = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


def worst(statuses: list[Status]) -> Status:
    """The most severe of ``statuses`` (``pass`` for none)."""
    return max(statuses, key=_SEVERITY.__getitem__, default="pass")


class Check(BaseModel):
    """The verdict of one check.

    Attributes:
        id: the check's id (part of the interface; see docs/doctor.md).
        status: ``pass``, ``warn``, ``fail`` or ``skip``.
        summary: one line of evidence, with the values.
        fix: what to do about a non-pass, or None.
        ranks: the ranks the verdict is about (empty when it concerns none in particular).
        hosts: the hosts the verdict is about.
        evidence: the facts behind the verdict (JSON values).
    """

    __module__ = "distinit.doctor"
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    status: Status
    summary: str
    fix: str | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    evidence: dict[str, Any] = Field(default_factory=dict)


class DoctorReport(BaseModel):
    """What ``distinit doctor`` found: the world's report on every rank once the world formed.

    Attributes:
        ok: no check failed (warnings allowed).
        world_size: ranks in the world (1 when the environment could not be resolved).
        rank: the rank that made this report.
        elapsed_s: seconds from start to report.
        checks: one verdict per check, in report order.
    """

    __module__ = "distinit.doctor"
    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    world_size: int = Field(ge=1)
    rank: int = Field(ge=0)
    elapsed_s: float = Field(ge=0)
    checks: tuple[Check, ...]

    @property
    def exit_status(self) -> int:
        """0 nothing failed, 2 the environment could not be resolved, 1 another check failed."""
        if any(c.id == "env" and c.status == "fail" for c in self.checks):
            return EXIT_BAD_ENV
        return EXIT_OK if self.ok else EXIT_FAILED

    def check(self, check_id: str) -> Check:
        """The verdict of ``check_id``; KeyError if it is not in the report."""
        for item in self.checks:
            if item.id == check_id:
                return item
        raise KeyError(check_id)

    def about(self, rank: int) -> tuple[Check, ...]:
        """The warnings and failures that name ``rank``."""
        return tuple(c for c in self.checks if c.status in ("warn", "fail") and rank in c.ranks)


#: Called with each check as it completes (rank 0's progress output); see ``run(on_check=...)``.
OnCheck = Callable[[Check], None]


def make_report(checks: list[Check], *, world_size: int, rank: int, elapsed_s: float) -> DoctorReport:
    """A report over ``checks``: ok when none failed."""
    return DoctorReport(
        ok=all(c.status != "fail" for c in checks),
        world_size=world_size,
        rank=rank,
        elapsed_s=round(elapsed_s, 4),
        checks=tuple(checks),
    )


def from_error(check_id: str, exc: DistinitError, *, fix: str, ranks: tuple[int, ...] = ()) -> Check:
    """A ``fail`` verdict quoting one of our errors: its first line as summary, its own fix if it has one."""
    return Check(
        id=check_id,
        status="fail",
        summary=f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
        fix=exc.fix or fix,
        ranks=ranks,
        evidence={"error": str(exc)},
    )
