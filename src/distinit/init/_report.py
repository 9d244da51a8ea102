"""What :func:`distinit.init_with_retry` did: one record per attempt, plus the totals."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from distinit.env import DistEnv

#: Where an attempt was when it ended: pre-flight checks, reaching the master, creating or joining the
#: store, the join protocol on the store, torch's ``init_process_group``, the tiny check collective.
Phase = Literal["preflight", "probe", "store", "join", "init", "verify", "done"]


class AttemptRecord(BaseModel):
    """One rendezvous attempt as this rank saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int = Field(ge=1, description="1-based attempt number.")
    generation: int | None = Field(default=None, description="Store generation the attempt joined.")
    phase: Phase = Field(description="Where the attempt ended (``done`` on success).")
    elapsed: float = Field(ge=0, description="Seconds this attempt took.")
    started_at: float = Field(ge=0, description="Seconds since the call began when the attempt started.")
    error: str | None = Field(default=None, description="Error class name, ``None`` on success.")
    message: str | None = Field(default=None, description="First line of the error message.")
    missing_ranks: tuple[int, ...] = Field(default=(), description="Ranks not yet joined when it ended.")
    retried: bool = Field(default=False, description="Whether another attempt followed.")


class InitReport(BaseModel):
    """How the process group was formed (or found already formed): attempts and totals.

    ``model_dump_json()`` gives the machine-readable form; ``str(report)`` a one-line summary.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = Field(description="The backend of the process group.")
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    master: str | None = Field(default=None, description="Rendezvous endpoint ``addr:port``.")
    store: Literal["hosted", "client", "agent", "existing"] = Field(
        description="hosted: this rank serves the TCPStore; client: connected to rank 0's; agent: torchrun's; "
        "existing: a process group was already initialised."
    )
    generation: int | None = Field(default=None, description="Store generation that formed the group.")
    attempts: tuple[AttemptRecord, ...] = Field(default=())
    elapsed: float = Field(ge=0, description="Seconds from the call to a formed group.")
    already_initialized: bool = Field(default=False, description="True if the call found a compatible group.")
    group_counter_reset: int = Field(
        default=0, ge=0, description="How often torch's leaked group counter was reset (pytorch/pytorch#46561)."
    )
    world: DistEnv | None = Field(
        default=None,
        description="The world verified by the ranks' host identities: the environment's values, with node rank, "
        "local world size and node count filled in where it left them unknown (sources: 'world: host identity'). "
        "None when the group was not verified (verify=False, or a group that already existed).",
    )

    def __str__(self) -> str:
        if self.already_initialized:
            return f"rank {self.rank}/{self.world_size}: {self.backend} process group already initialised"
        where = f"via {self.store} store at {self.master}" if self.master else "alone (a local store, no network)"
        return (
            f"rank {self.rank}/{self.world_size}: {self.backend} process group formed in {self.elapsed:.2f} s "
            f"after {len(self.attempts)} attempt(s) {where}"
        )


# Their public home, set once built (pydantic resolves the annotations in the defining module): reprs and
# pickles never name a private module.
AttemptRecord.__module__ = "distinit.init"
InitReport.__module__ = "distinit.init"
