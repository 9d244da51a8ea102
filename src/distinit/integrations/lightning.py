"""``DistinitEnvironment``: Lightning's ``ClusterEnvironment`` answered by the launcher's own world.

Lightning's DDP computes every process's rank as ``node_rank * devices + local_rank`` and reads the
node rank from ``NODE_RANK`` (else 0). Under ``mpirun`` nobody sets it, so every node claims ranks
0..devices-1 and the job hangs until its timeout (Lightning #13639, closed as won't fix). This
environment takes rank, world size, local rank and node rank from :func:`distinit.env_from_scheduler`
instead. As in Lightning's own launcher environments, the launcher's ranks stand (Lightning's arithmetic
is only logged), so round-robin placements (``mpirun --map-by node``, ``srun --distribution=cyclic``)
train too; what cannot train is refused, with the fix and the same words on every rank, before DDP
init: an unknown node rank or master address, and ``devices``/``num_nodes`` that do not match the
processes the launcher started on each node::

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
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from distinit._port import PORT_ADVICE, master_addr_fix
from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import ConflictingEnvError, IncompleteEnvError, RankLostError, SchedulerEnvError
from distinit.integrations._placement import (
    exchanged_layout,
    launch_flags,
    launcher_layout,
    placement_conflict,
    uneven_conflict,
)

__all__ = ["DistinitEnvironment"]

logger = logging.getLogger("distinit.integrations")

NODE_RANK_FIX = (
    "export NODE_RANK (this node's index, from 0) on each node, or pass the world verified by "
    "distinit.setup(): DistinitEnvironment(env=distinit.setup().env)."
)

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
        environ: the variables to resolve, a mapping of ``str`` to ``str``; ``os.environ`` (read now, once)
            when ``None``. Bytes keys (``os.environb``) are refused, not decoded: ``os.environ`` holds the same
            variables already decoded the way Python decodes them everywhere else.
        env: an already resolved (or verified, e.g. ``distinit.setup().env``) world to use instead.

    Raises:
        TypeError: ``environ`` is not a mapping of ``str`` to ``str``, or ``env`` is not a ``DistEnv``.
        SchedulerEnvError: the environment does not resolve (see ``env_from_scheduler``).
        ValueError: both ``environ`` and ``env`` were given.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, *, env: DistEnv | None = None) -> None:
        super().__init__()
        _check_arguments(environ, env)
        if env is not None and environ is not None:
            raise ValueError("DistinitEnvironment: pass environ or env, not both")
        self._env = env if env is not None else env_from_scheduler(environ)
        self._layout = launcher_layout(self._env, os.environ if environ is None else environ)

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
        """Keep the launcher's world size; Lightning's ``num_nodes * devices`` is only logged when it differs.

        Lightning's own launcher environments (``SLURMEnvironment``, ``MPIEnvironment``,
        ``TorchElasticEnvironment``) ignore this call too; a wrong ``devices``/``num_nodes`` is refused by
        :meth:`validate_settings`, on every rank, before DDP init.
        """
        if size != self._env.world_size:
            logger.debug(
                "rank %d: Lightning's world size %d (num_nodes * devices) differs from the launcher's %d; "
                "the launcher's stands",
                self._env.rank,
                size,
                self._env.world_size,
                extra={
                    "distinit": {"event": "lightning.world_size_ignored", "rank": self._env.rank, "lightning": size}
                },
            )

    def global_rank(self) -> int:
        """This process's rank, as the launcher numbered it."""
        return self._env.rank

    def set_global_rank(self, rank: int) -> None:
        """Keep the launcher's rank; Lightning's ``node_rank * devices + local_rank`` is only logged when it differs.

        It differs under round-robin placements (``mpirun --map-by node``, ``srun --distribution=cyclic``),
        which train correctly with the launcher's ranks, as they do with Lightning's own launcher
        environments. Strategies that build node-local groups from consecutive ranks (``ModelParallelStrategy``'s
        tensor-parallel dimension, FSDP ``HYBRID_SHARD``) then span nodes: see docs/integrations.md.
        """
        if rank != self._env.rank:
            logger.debug(
                "rank %d: Lightning computed global rank %d (node_rank %s * devices + local_rank %d); the "
                "launcher's rank %d stands (the placement is not one block of ranks per node: node-local groups "
                "of ModelParallelStrategy or FSDP HYBRID_SHARD would span nodes)",
                self._env.rank,
                rank,
                self._env.node_rank,
                self._env.local_rank,
                self._env.rank,
                extra={"distinit": {"event": "lightning.rank_ignored", "rank": self._env.rank, "lightning": rank}},
            )

    def local_rank(self) -> int:
        """This process's rank among the processes of its node."""
        return self._env.local_rank

    def node_rank(self) -> int:
        """This node's index.

        Raises:
            IncompleteEnvError: the launcher gives no node rank and no rule derives one (the notes say why).
        """
        env = self._env
        if env.node_rank is None and self._layout.uneven:
            raise uneven_conflict(env, self._layout, self._source("local_world_size"))
        ruled = env.sources.get("node_rank", ("",))[0].startswith("rule:")
        off_node = env.local_world_size is not None and env.local_world_size < env.world_size
        if env.num_nodes is None and (env.node_rank is None or (ruled and off_node)):
            # Only the ranks on rank 0's node know their node (0): all of them refuse, in the same words.
            raise IncompleteEnvError(
                f"the node ranks of this {env.launcher} world of {env.world_size} are unknown off rank 0's node: "
                "the launcher exports no node index or node count, and Lightning would take node 0 on every "
                "node (Lightning #13639).",
                variables=("NODE_RANK",),
                why="only the ranks on rank 0's node can tell their node; the others cannot tell how the ranks off "
                "that node are spread over the nodes.",
                fix=NODE_RANK_FIX,
            )
        if env.node_rank is None:
            why = next((note for note in env.notes if note.startswith("node_rank is unknown")), "")
            raise IncompleteEnvError(
                f"the node rank of rank {env.rank} ({env.launcher}) is unknown, and Lightning would "
                "take node 0 on every node (Lightning #13639).",
                variables=("NODE_RANK",),
                why=why or "the launcher exports no node index.",
                fix=NODE_RANK_FIX,
            )
        return env.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Refuse ``devices``/``num_nodes`` that cannot train as the launcher started the processes.

        Lightning calls this at the start of ``fit()`` (``Fabric.launch()``), before DDP init. The verdict is
        decided from facts every rank holds (Slurm's tasks per node; the node count on two nodes), or, once a
        process group of this world exists (``distinit.setup()`` before the Trainer), from one bounded
        ``all_reduce`` of every rank's node, node size and settings: so every rank raises the same error.

        Raises:
            TypeError: ``num_devices`` or ``num_nodes`` is not an ``int``.
            ConflictingEnvError: ``devices`` differs from the processes the launcher started on a node (or the
                nodes run different numbers), or ``devices * num_nodes`` from the world size.
            RankLostError: after ``distinit.setup()``, a rank went away before the comparison (it is named).
        """
        for name, value in (("num_devices", num_devices), ("num_nodes", num_nodes)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"validate_settings: {name} must be an int, not {type(value).__name__} ({value!r})")
        layout = self._layout
        table = _exchange(self._env, num_devices, num_nodes)
        if table is not None:
            exchanged = exchanged_layout(table)
            if exchanged.counts is not None and not (layout.counts is not None and layout.ordered):
                layout = exchanged  # the launcher's own list (Slurm) stays the one quoted when there is one
            if len({(row[2], row[3]) for row in table}) > 1 and not layout.uneven:
                raise self._settings_differ(table)
        conflict = placement_conflict(
            devices=num_devices,
            num_nodes=num_nodes,
            env=self._env,
            layout=layout,
            local_source=self._source("local_world_size"),
            world_source=self._source("world_size"),
        )
        if conflict is not None:
            raise conflict

    def _settings_differ(self, table: Sequence[Sequence[int]]) -> ConflictingEnvError:
        """The ranks passed different ``devices``/``num_nodes`` (e.g. computed per node on uneven nodes)."""
        by_setting: dict[tuple[int, int], list[int]] = {}
        for rank, row in enumerate(table):
            by_setting.setdefault((row[2], row[3]), []).append(rank)
        shown = "; ".join(
            f"devices={d}, num_nodes={n} on ranks {ranks}" for (d, n), ranks in sorted(by_setting.items())
        )
        counts = exchanged_layout(table).counts
        nodes = f" (processes per node: {','.join(map(str, counts))})" if counts else ""
        return ConflictingEnvError(
            f"the ranks passed different Lightning settings: {shown}{nodes}.",
            variables=(self._source("local_world_size"),),
            why="Lightning needs the same devices and num_nodes on every rank, and the same number of processes "
            "on every node.",
            fix="start the same number of processes on every node "
            f"({launch_flags(self._env.launcher, '<nodes>', '<per node>')}) and pass that number as devices.",
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


def _check_arguments(environ: object, env: object) -> None:
    """Raise ``TypeError`` for arguments of the wrong type (a list, a number, bytes keys, a dict for ``env``)."""
    if env is not None and not isinstance(env, DistEnv):
        raise TypeError(
            f"DistinitEnvironment: env must be a distinit.DistEnv (e.g. distinit.setup().env or "
            f"env_from_scheduler()), not {type(env).__name__}; pass launcher variables as environ=..."
        )
    if environ is None:
        return
    if not isinstance(environ, Mapping):
        raise TypeError(
            "DistinitEnvironment: environ must be a mapping of str to str (like os.environ), "
            f"not {type(environ).__name__}"
        )
    for key, value in environ.items():
        if not isinstance(key, str) or not isinstance(value, str):
            hint = (
                " (os.environb? pass os.environ, which holds the same variables decoded)"
                if isinstance(key, bytes)
                else ""
            )
            raise TypeError(
                f"DistinitEnvironment: environ must map str to str, but it holds {key!r}: {value!r} "
                f"({type(key).__name__} to {type(value).__name__}){hint}"
            )


#: How long the ranks wait for each other to compare their Lightning settings (one tiny all_reduce).
AGREE_TIMEOUT = 60.0


def _exchange(env: DistEnv, devices: int, num_nodes: int) -> list[list[int]] | None:
    """Every rank's ``(node_rank, local_world_size, devices, num_nodes)`` (-1/0 where unknown), in one ``all_reduce``.

    None without a default process group of this world (then only the launcher's facts are known).

    Raises:
        RankLostError: a peer went away or did not answer within :data:`AGREE_TIMEOUT`, naming it when
            ``distinit.setup()``'s liveness can.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != env.world_size:
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    table = torch.zeros(env.world_size, 4, dtype=torch.int64, device=device)
    row = (-1 if env.node_rank is None else env.node_rank, env.local_world_size or 0, devices, num_nodes)
    table[env.rank] = torch.tensor(row, dtype=torch.int64)
    try:
        work = dist.all_reduce(table, async_op=True)
        done = work is not None and work.wait(timeout=timedelta(seconds=AGREE_TIMEOUT))
    except RuntimeError as exc:  # gloo/NCCL: a peer closed its connection, or the timeout
        raise _peer_failed(env, exc) from exc
    if not done:  # pragma: no cover - torch raises instead
        raise ConflictingEnvError(
            f"rank {env.rank}: the other ranks did not compare their Lightning settings within {AGREE_TIMEOUT:.0f} s.",
            why="another rank failed before it reached fit().",
            fix="see the other ranks' errors.",
        )
    return [[int(v) for v in r] for r in table.cpu().tolist()]


def _peer_failed(env: DistEnv, exc: BaseException) -> RankLostError:
    """The comparison's ``all_reduce`` failed: name the rank that went away (setup()'s liveness, bounded)."""
    from distinit._foreign import first_line
    from distinit.init import lost_peer

    found = lost_peer(exc)
    who = found or "another rank (none could be named: distinit.setup() did not form this group)"
    return RankLostError(
        f"rank {env.rank}: the ranks could not compare their Lightning settings before DDP init: {who}. "
        f"The collective said: {first_line(exc)}",
        rank=env.rank,
        why="a rank ended (an exception, a kill, the launcher stopping it) or stalled after setup() and before "
        f"fit(); the comparison waits at most {AGREE_TIMEOUT:.0f} s.",
        fix="read the log of the rank named above (when it is unknown: of the ranks listed) for why it ended, then "
        "start the job again.",
    )
