"""``DistinitEnvironment``: Lightning's ``ClusterEnvironment`` answered by the launcher's own world.

Lightning's DDP computes every process's rank as ``node_rank * devices + local_rank`` and reads the
node rank from ``NODE_RANK`` (else 0). Under ``mpirun`` nobody sets it, so every node claims ranks
0..devices-1 and the job hangs until its timeout (Lightning #13639, closed as won't fix). This
environment takes rank, world size, local rank and node rank from :func:`distinit.env_from_scheduler`
instead, and refuses, with the fix, every setting Lightning would otherwise get silently wrong:
an unknown node rank or master address, ``devices``/``num_nodes`` that do not match what the
launcher started, and a placement that is not one block of ``devices`` ranks per node::

    from distinit.integrations.lightning import DistinitEnvironment

    trainer = Trainer(accelerator="gpu", devices=4, num_nodes=2, strategy="ddp", plugins=[DistinitEnvironment()])
    fabric = Fabric(devices=4, num_nodes=2, plugins=[DistinitEnvironment()])

Importing this module imports Lightning: the unified ``lightning`` package, the standalone
``lightning_fabric`` (behind ``pytorch_lightning``), or both, in which case the class is an instance
of both packages' ``ClusterEnvironment``. It never imports mpi4py (Lightning's own
``MPIEnvironment`` does, and hangs at start-up on some systems, Lightning #20049).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from distinit.env import DistEnv, env_from_scheduler
from distinit.env._model import master_addr_fix
from distinit.env._port import PORT_ADVICE
from distinit.errors import ConflictingEnvError, IncompleteEnvError, SchedulerEnvError

__all__ = ["DistinitEnvironment"]

#: Modules that define Lightning's ClusterEnvironment: the unified package, then the standalone one.
_BASE_MODULES = (
    ("lightning", "lightning.fabric.plugins.environments.cluster_environment"),
    ("lightning_fabric", "lightning_fabric.plugins.environments.cluster_environment"),
)


def _cluster_environment() -> type:
    """Every installed Lightning's ``ClusterEnvironment``, as one base class.

    Raises:
        ImportError: neither ``lightning`` nor ``pytorch_lightning``/``lightning_fabric`` is installed.
    """
    bases = tuple(
        importlib.import_module(module).ClusterEnvironment
        for package, module in _BASE_MODULES
        if importlib.util.find_spec(package) is not None
    )
    if not bases:
        raise ImportError(
            "distinit.integrations.lightning needs Lightning: pip install 'distinit[lightning]' (or pytorch-lightning)"
        )
    # Both packages installed: Trainer of each checks isinstance against its own class, so subclass both.
    return bases[0] if len(bases) == 1 else type("ClusterEnvironment", bases, {"__module__": __name__})


if TYPE_CHECKING:
    _Base = object
else:
    _Base = _cluster_environment()


class DistinitEnvironment(_Base):
    """A Lightning ``ClusterEnvironment`` whose ranks come from the launcher (``env_from_scheduler``).

    Args:
        environ: the variables to resolve; ``os.environ`` (read now, once) when ``None``.
        env: an already resolved (or verified, e.g. ``distinit.setup().env``) world to use instead.

    Raises:
        SchedulerEnvError: the environment does not resolve (see ``env_from_scheduler``).
        ValueError: both ``environ`` and ``env`` were given.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, *, env: DistEnv | None = None) -> None:
        super().__init__()
        if env is not None and environ is not None:
            raise ValueError("pass environ or env, not both")
        self._env = env if env is not None else env_from_scheduler(environ)

    @property
    def env(self) -> DistEnv:
        """The world this environment reports."""
        return self._env

    @property
    def creates_processes_externally(self) -> bool:
        """True when a launcher started the processes: Lightning must not start its own."""
        return self._env.launcher != "none"

    @property
    def main_address(self) -> str:
        """Rank 0's host.

        Raises:
            IncompleteEnvError: the launcher does not say which host runs rank 0.
        """
        if self._env.master_addr is None:
            raise IncompleteEnvError(
                f"MASTER_ADDR is unknown for rank {self._env.rank} of {self._env.world_size} ({self._env.launcher}).",
                variables=("MASTER_ADDR",),
                why="Lightning would fall back to 127.0.0.1, so the ranks on other nodes would wait for a store "
                "that never answers until their timeout.",
                fix=master_addr_fix(self._env.launcher),
            )
        return self._env.master_addr

    @property
    def main_port(self) -> int:
        """Rank 0's store port.

        Raises:
            IncompleteEnvError: the launcher gives no port and none can be derived from a job id.
        """
        if self._env.master_port is None:
            raise IncompleteEnvError(
                f"MASTER_PORT is unknown for rank {self._env.rank} of {self._env.world_size} ({self._env.launcher}).",
                variables=("MASTER_PORT",),
                why="the launcher exports no port and no job id to derive one from.",
                fix=PORT_ADVICE,
            )
        return self._env.master_port

    @staticmethod
    def detect() -> bool:
        """True when a launcher's variables are present in ``os.environ`` (never imports mpi4py)."""
        try:
            return env_from_scheduler(strict=False).launcher != "none"
        except SchedulerEnvError:
            return True  # a launcher is there but its variables are broken: constructing says which

    def world_size(self) -> int:
        """The number of processes the launcher started."""
        return self._env.world_size

    def set_world_size(self, size: int) -> None:
        """Accept Lightning's ``num_nodes * devices`` only when it is the launcher's world size.

        Raises:
            ConflictingEnvError: it is not.
        """
        if size != self._env.world_size:
            raise self._world_conflict(f"Lightning's world size is {size} (num_nodes * devices)")

    def global_rank(self) -> int:
        """This process's rank, as the launcher numbered it."""
        return self._env.rank

    def set_global_rank(self, rank: int) -> None:
        """Accept the rank Lightning computed (``node_rank * devices + local_rank``) only when it is the launcher's.

        Once the process group exists (``distinit.setup()`` before the Trainer), every rank learns in one
        bounded ``all_reduce`` which ranks Lightning numbered wrongly, and all of them raise the same error:
        none goes on into ``fit`` to wait for peers that already failed.

        Raises:
            ConflictingEnvError: it differs, on this rank or (with a group) on any rank; two processes would
                otherwise hold the same rank.
        """
        env = self._env
        wrong = _wrong_ranks(env, agrees=rank == env.rank)
        if rank == env.rank and not wrong:
            return
        lws, node = env.local_world_size, env.node_rank
        if rank != env.rank and lws is not None and node and node * lws + env.local_rank == env.rank:
            # The launcher's layout is one block per node: Lightning's rank is off because devices != lws.
            raise self._devices_conflict((rank - env.local_rank) // node)
        source = self._source("rank")
        what = (
            f"Lightning's ranks (node_rank * devices + local_rank) differ from the launcher's on ranks {wrong}"
            if wrong
            else f"Lightning computed global rank {rank} = node_rank {env.node_rank} * devices + local_rank "
            f"{env.local_rank}, but the launcher started this process as {source}={env.rank}"
        )
        raise ConflictingEnvError(
            f"{what}.",
            variables=(source, *env.sources.get("node_rank", ("NODE_RANK",))),
            why="Lightning's DDP assumes every node runs one block of `devices` consecutive ranks; this launch "
            "placed ranks otherwise (mpirun --map-by node, srun --distribution=cyclic, uneven nodes), so two "
            "processes would both believe they are the same rank.",
            fix="place the same number of consecutive ranks on every node: mpirun --map-by slot (the default, no "
            "--map-by node), srun --distribution=block, or torchrun.",
        )

    def local_rank(self) -> int:
        """This process's rank among the processes of its node."""
        return self._env.local_rank

    def node_rank(self) -> int:
        """This node's index.

        Raises:
            IncompleteEnvError: the launcher gives no node rank and no rule derives one (the notes say why).
        """
        if self._env.node_rank is None:
            why = next((note for note in self._env.notes if note.startswith("node_rank is unknown")), "")
            raise IncompleteEnvError(
                f"the node rank of rank {self._env.rank} ({self._env.launcher}) is unknown, and Lightning would "
                "take node 0 on every node (Lightning #13639).",
                variables=("NODE_RANK",),
                why=why or "the launcher exports no node index.",
                fix="export NODE_RANK (this node's index, from 0) on each node, or pass the world verified by "
                "distinit.setup(): DistinitEnvironment(env=distinit.setup().env).",
            )
        return self._env.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Refuse ``devices``/``num_nodes`` that do not match what the launcher started.

        Raises:
            ConflictingEnvError: ``devices`` differs from the processes on this node, or
                ``devices * num_nodes`` from the world size.
        """
        env = self._env
        if env.local_world_size is not None and num_devices != env.local_world_size:
            raise self._devices_conflict(num_devices)
        if num_devices * num_nodes != env.world_size:
            raise self._world_conflict(f"devices={num_devices} * num_nodes={num_nodes} = {num_devices * num_nodes}")

    def _world_conflict(self, claimed: str) -> ConflictingEnvError:
        """Lightning's world size (``claimed``, in words) differs from the launcher's."""
        world, source = self._env.world_size, self._source("world_size")
        return ConflictingEnvError(
            f"{claimed} processes, but the launcher started {world} ({source}={world}).",
            variables=(source,),
            why="Lightning would wait for processes that were never started, or leave some out.",
            fix=f"set num_nodes to the number of nodes and devices to the processes per node, so that "
            f"num_nodes * devices = {world}.",
        )

    def _devices_conflict(self, num_devices: int) -> ConflictingEnvError:
        """``devices`` differs from the number of processes the launcher started on this node."""
        lws = self._env.local_world_size
        source = self._source("local_world_size")
        return ConflictingEnvError(
            f"devices={num_devices}, but the launcher started {lws} process(es) on this node ({source}={lws}).",
            variables=(source,),
            why="with DistinitEnvironment the launcher starts every process and each drives one device; "
            "Lightning starts none of its own, so its ranks and the launcher's would not match.",
            fix=f"set devices={lws}, or start {num_devices} processes per node with the launcher "
            f"(torchrun --nproc-per-node={num_devices}, srun --ntasks-per-node={num_devices}, "
            f"mpirun --map-by ppr:{num_devices}:node).",
        )

    def _source(self, field: str) -> str:
        """The variable (or rule) ``field`` of the world came from, for messages."""
        return self._env.sources.get(field, (field.upper(),))[0]

    def __repr__(self) -> str:
        env = self._env
        return (
            f"DistinitEnvironment(rank={env.rank}, world_size={env.world_size}, local_rank={env.local_rank}, "
            f"node_rank={env.node_rank}, launcher={env.launcher!r})"
        )


#: How long the ranks wait for each other to agree on Lightning's numbering (one tiny all_reduce).
AGREE_TIMEOUT = 60.0


def _wrong_ranks(env: DistEnv, *, agrees: bool) -> list[int]:
    """The ranks whose Lightning rank differs from the launcher's, learnt by all ranks in one ``all_reduce``.

    Empty without a default process group of this world (then each rank only knows about itself).

    Raises:
        ConflictingEnvError: the peers did not answer within :data:`AGREE_TIMEOUT` (one of them failed first).
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != env.world_size:
        return []
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flags = torch.zeros(env.world_size, dtype=torch.int32, device=device)
    flags[env.rank] = 0 if agrees else 1
    work = dist.all_reduce(flags, async_op=True)
    if work is None or not work.wait(timeout=timedelta(seconds=AGREE_TIMEOUT)):  # pragma: no cover - torch raises
        raise ConflictingEnvError(
            f"rank {env.rank}: the other ranks did not compare Lightning's ranks within {AGREE_TIMEOUT:.0f} s.",
            why="another rank failed before it reached the Trainer.",
            fix="see the other ranks' errors.",
        )
    return [int(r) for r in torch.nonzero(flags.cpu()).flatten().tolist()]
