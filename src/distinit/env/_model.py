"""``DistEnv``: the resolved torch world of one process, immutable, with provenance."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from distinit._port import master_addr_fix
from distinit.errors import IncompleteEnvError

#: Short names of the launchers and schedulers ``env_from_scheduler`` recognises.
Launcher = Literal[
    "slurm",
    "openmpi",
    "mpich",
    "mvapich2",
    "pals",
    "lsf",
    "torchrun",
    "kubeflow",
    "azureml",
    "sagemaker",
    "vertex",
    "deepspeed",
    "horovod",
    "env",
    "none",
]


class DistEnv(BaseModel):
    """The torch world of this process, resolved from launcher variables. Immutable.

    ``None`` means *unknown*, never a guess: distinit does not invent a node rank or a master
    address it cannot justify. Every value's origin is in ``sources`` (field → variables or rule)
    and every assumption or warning is in ``notes``.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        local_rank: rank among the processes of this node.
        world_size: number of processes in the world.
        local_world_size: number of processes on this node, when known.
        node_rank: index of this node (torchrun's ``GROUP_RANK``), when known.
        num_nodes: number of nodes, when known.
        master_addr: host of rank 0's store, when known.
        master_port: port of rank 0's store, when known.
        launcher: short name of the innermost launcher (``"none"`` when not launched).
        job_id: the scheduler's job or run id, when there is one.
        restart_count: how many times the launcher restarted this job (torchrun, Slurm requeue).
        launched: how many processes the launcher itself says it started (torchrun's ``LOCAL_WORLD_SIZE``
            x ``GROUP_WORLD_SIZE``, else ``OMPI_COMM_WORLD_SIZE``, ``MV2_COMM_WORLD_SIZE``, ``PMI_SIZE``,
            ``SLURM_STEP_NUM_TASKS``, innermost first), when one says. It may differ from ``world_size``
            (an exported ``WORLD_SIZE`` larger than what was started): that is no error here, and init's
            timeout names the ranks that were never launched. :meth:`launched_from` says it in words.
        agent_store: ``MASTER_ADDR:MASTER_PORT`` is a store that torchrun's agent hosts
            (``TORCHELASTIC_USE_AGENT_STORE=True``), so rank 0 connects to it instead of hosting one. A
            ``DistEnv`` built by hand says False unless given: under torchrun's agent store, derive it from
            ``env_from_scheduler()`` (``model_validate({**env.model_dump(), ...})``) or pass ``agent_store=True``.
        sources: field name → the variables or the rule the value came from.
        notes: assumptions made and warnings, in words.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    local_world_size: int | None = Field(default=None, ge=1)
    node_rank: int | None = Field(default=None, ge=0)
    num_nodes: int | None = Field(default=None, ge=1)
    master_addr: str | None = Field(default=None, min_length=1)
    master_port: int | None = Field(default=None, ge=1, le=65535)
    launcher: Launcher
    job_id: str | None = None
    restart_count: int = Field(default=0, ge=0)
    launched: int | None = Field(default=None, ge=1)
    agent_store: bool = False
    sources: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check_invariants(self) -> DistEnv:
        # A backstop only: the resolver raises SchedulerEnvError naming the variables first.
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        if self.local_world_size is not None:
            if self.local_rank >= self.local_world_size:
                raise ValueError(f"local_rank {self.local_rank} is not below local_world_size {self.local_world_size}")
            if self.local_world_size > self.world_size:
                raise ValueError(f"local_world_size {self.local_world_size} exceeds world_size {self.world_size}")
        elif self.local_rank >= self.world_size:
            raise ValueError(f"local_rank {self.local_rank} is not below world_size {self.world_size}")
        if self.num_nodes is not None:
            if self.num_nodes > self.world_size:
                raise ValueError(f"num_nodes {self.num_nodes} exceeds world_size {self.world_size}")
            if self.node_rank is not None and self.node_rank >= self.num_nodes:
                raise ValueError(f"node_rank {self.node_rank} is not below num_nodes {self.num_nodes}")
        return self

    def launched_from(self) -> str:
        """Where :attr:`launched` came from, with its value, for messages; ``""`` when it is unknown.

        ``OMPI_COMM_WORLD_SIZE=4``; a count that is a product of two variables (torchrun's) as
        ``torchrun: LOCAL_WORLD_SIZE=2 x 3 node(s)``; ``launched=4`` when ``sources`` does not say.
        """
        if self.launched is None:
            return ""
        names = self.sources.get("launched", ())
        if len(names) == 1:
            return f"{names[0]}={self.launched}"
        if len(names) == 2 and self.num_nodes and self.launched % self.num_nodes == 0:
            return f"{self.launcher}: {names[0]}={self.launched // self.num_nodes} x {self.num_nodes} node(s)"
        return f"launched={self.launched}"

    def to_environ(self) -> dict[str, str]:
        """The torch variables for this world, as strings.

        Always ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; ``LOCAL_WORLD_SIZE``, ``NODE_RANK`` and
        ``GROUP_RANK`` (both the node rank), ``MASTER_ADDR`` and ``MASTER_PORT`` only where known.
        """
        environ = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
        }
        if self.local_world_size is not None:
            environ["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        if self.node_rank is not None:
            environ["NODE_RANK"] = str(self.node_rank)
            environ["GROUP_RANK"] = str(self.node_rank)
        if self.master_addr is not None:
            environ["MASTER_ADDR"] = self.master_addr
        if self.master_port is not None:
            environ["MASTER_PORT"] = str(self.master_port)
        return environ

    def export(self) -> None:
        """Write :meth:`to_environ` into ``os.environ`` so ``init_process_group("env://")`` finds it.

        Other unknown variables (``NODE_RANK`` where no rule derives it) are left as they are.

        Raises:
            IncompleteEnvError: ``MASTER_ADDR`` is unknown in a world that is not known to run on one
                node (a plain multi-node ``mpirun``) and ``os.environ`` has none either: every rank
                would otherwise fall back to its own loopback and wait for the others until its
                timeout. The fix names the launcher's way to pass it (``mpirun -x MASTER_ADDR=...``).
        """
        if self.master_addr is None and self.world_size > 1 and not os.environ.get("MASTER_ADDR"):
            raise IncompleteEnvError(
                f"MASTER_ADDR is unknown for rank {self.rank} of {self.world_size} ({self.launcher}): "
                "the launcher does not say which host runs rank 0.",
                variables=("MASTER_ADDR",),
                why="without it torch (and Lightning) fall back to 127.0.0.1, so the ranks on other nodes wait "
                "for a store that never answers until their timeout.",
                fix=master_addr_fix(self.launcher),
            )
        os.environ.update(self.to_environ())


# Its public home, so reprs and pickles never name a private module. Set after the class is built, not
# in its body: pydantic resolves the (string) annotations in the namespace of ``__module__``, and
# ``distinit.env`` is still empty while this module runs, so a ``__module__`` set in the body left the
# schema unbuilt at import (``__pydantic_complete__`` False); every model that names ``DistEnv``
# (``InitReport``, ``SetupResult``) then rebuilt its schema inline, and the first ``DistEnv(...)`` rebuilt
# it once more.
DistEnv.__module__ = "distinit.env"
