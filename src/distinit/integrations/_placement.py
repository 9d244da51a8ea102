"""How many processes the launcher put on each node, and whether Lightning's ``devices``/``num_nodes`` fit it.

Pure: facts in, a verdict out, no torch and no Lightning. Lightning's DDP gives every node ``devices``
processes and splits the data into ``devices * num_nodes`` shards (its ``DistributedSampler`` has
``num_replicas = num_nodes * devices``), so a job trains as launched only when every node runs exactly
``devices`` processes and there are ``num_nodes`` nodes. Which global ranks a node holds does not matter
(Lightning's own ``SLURMEnvironment``, ``MPIEnvironment`` and ``TorchElasticEnvironment`` keep the
launcher's ranks), so round-robin placements train and only the counts are checked.

The verdict is built from facts every rank holds (the launcher's per-node counts, or the table the ranks
exchanged), so every rank raises the same error, word for word, before any of them enters DDP init.

Reads launcher variables itself: Slurm's per-node task list (``SLURM_STEP_TASKS_PER_NODE``), which ``DistEnv``
does not keep (only this node's count, ``local_world_size``); a ``DistEnv`` field for the per-node counts would
move this read into env/. ``LOCAL_WORLD_SIZE`` is otherwise only a label, where ``sources`` names no variable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from distinit._hostlist import expand_counts
from distinit.env import DistEnv
from distinit.errors import ConflictingEnvError, SchedulerEnvError

#: The Slurm variables that list the step's tasks per node (``"2(x2)"``, ``"2,1"``).
SLURM_COUNTS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


@dataclass(frozen=True)
class Layout:
    """What is known, identically on every rank, about the processes per node.

    Attributes:
        counts: processes on each node, in node order (``ordered``) or largest first; None when unknown.
        ordered: ``counts`` is in node-rank order (else only the multiset is known).
        uneven: the nodes are known to run different numbers of processes (even when ``counts`` is None).
        source: where the facts came from, for messages (``SLURM_STEP_TASKS_PER_NODE='2,1'``).
    """

    counts: tuple[int, ...] | None
    ordered: bool
    uneven: bool
    source: str


UNKNOWN = Layout(None, False, False, "")
SHARDS = (
    "Lightning gives every node `devices` processes and splits the data into devices * num_nodes shards "
    "(its DistributedSampler's num_replicas), so "
)


def launcher_layout(env: DistEnv, environ: Mapping[str, str]) -> Layout:
    """The per-node counts every rank of ``env``'s launch can know without talking to the others.

    Slurm lists them (``SLURM_STEP_TASKS_PER_NODE``); otherwise they follow from this node's count, the
    world size and the node count when there are at most two nodes (``mpirun`` on two hosts).
    """
    counts_var = env.sources.get("local_world_size", ("",))[0]
    if env.launcher == "slurm" and counts_var in SLURM_COUNTS and counts_var in environ:
        value = environ[counts_var]
        try:
            counts = tuple(expand_counts(value, variable=counts_var))
        except SchedulerEnvError:
            counts = ()
        if counts and sum(counts) == env.world_size:
            return Layout(counts, True, len(set(counts)) > 1, f"{counts_var}={value!r}")
    lws, nodes, world = env.local_world_size, env.num_nodes, env.world_size
    if lws is None:
        return UNKNOWN
    if lws == world:
        return Layout((world,), True, False, f"{counts_var or 'LOCAL_WORLD_SIZE'}={lws}, the whole world")
    if nodes is None:
        return UNKNOWN
    nodes_var = env.sources.get("num_nodes", ("num_nodes",))[0]
    source = f"{counts_var or 'LOCAL_WORLD_SIZE'} and {nodes_var}: {world} processes on {nodes} nodes"
    if nodes == 2:
        pair = tuple(sorted((lws, world - lws), reverse=True))
        return Layout(pair, False, pair[0] != pair[1], source)
    if world % nodes or lws != world // nodes:
        return Layout(None, False, True, source)
    return UNKNOWN


def exchanged_layout(table: Sequence[Sequence[int]]) -> Layout:
    """The layout from every rank's ``(node_rank, local_world_size, ...)`` row (-1 / 0 where unknown)."""
    nodes = [row[0] for row in table]
    if any(node < 0 for node in nodes):
        return UNKNOWN
    per_node = Counter(nodes)
    if sorted(per_node) != list(range(len(per_node))):
        return UNKNOWN
    counts = tuple(per_node[node] for node in range(len(per_node)))
    return Layout(counts, True, len(set(counts)) > 1, "the node ranks the ranks exchanged")


def launch_flags(launcher: str, nodes: int | str, per_node: int | str) -> str:
    """The launcher's own way to start ``per_node`` processes on each of ``nodes`` nodes."""
    try:
        world: int | str = int(nodes) * int(per_node)
    except ValueError:
        world = f"{nodes}*{per_node}"
    by_launcher = {
        "slurm": f"srun -N{nodes} --ntasks-per-node={per_node}",
        "openmpi": f"mpirun -n {world} --map-by ppr:{per_node}:node on {nodes} hosts",
        "mpich": f"mpiexec -n {world} -ppn {per_node} on {nodes} hosts",
        "torchrun": f"torchrun --nnodes={nodes} --nproc-per-node={per_node}",
    }
    if launcher in by_launcher:
        return by_launcher[launcher]
    return f"{per_node} processes on each of {nodes} nodes (e.g. srun -N{nodes} --ntasks-per-node={per_node})"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith('s') else 's'}"


def uneven_conflict(env: DistEnv, layout: Layout, local_source: str) -> ConflictingEnvError:
    """The nodes run different numbers of processes: Lightning cannot train that, whatever its settings."""
    world, launcher = env.world_size, env.launcher
    shown = ",".join(map(str, layout.counts)) if layout.counts is not None else "different numbers of"
    order = "" if layout.ordered or layout.counts is None else "largest first; "
    nodes = len(layout.counts) if layout.counts is not None else env.num_nodes
    per = world // nodes if nodes and world % nodes == 0 else "K"
    shown_nodes = nodes if nodes else "<nodes>"
    dont = " (not -n alone: srun -n spreads the tasks unevenly)" if launcher == "slurm" else ""
    if per == "K":
        dont += f" ({world} processes do not split evenly over {shown_nodes} nodes: choose another node count)"
    return ConflictingEnvError(
        f"the launcher started {shown} processes on its {shown_nodes} nodes ({order}{layout.source}), but "
        "Lightning needs the same number on every node.",
        variables=(local_source,),
        why=SHARDS + "uneven nodes leave shards untrained or processes without a device (Lightning's own "
        "SLURMEnvironment refuses `srun -n` without `--ntasks-per-node` for this reason).",
        fix=f"start the same number of processes on every node: {launch_flags(launcher, shown_nodes, per)}"
        f"{dont}, with Trainer(devices={per}, num_nodes={shown_nodes}).",
    )


def placement_conflict(
    *,
    devices: int,
    num_nodes: int,
    env: DistEnv,
    layout: Layout,
    local_source: str,
    world_source: str,
) -> ConflictingEnvError | None:
    """The one error every rank raises when ``devices``/``num_nodes`` cannot train as launched, else None.

    Args:
        devices: Lightning's ``devices`` (processes per node).
        num_nodes: Lightning's ``num_nodes``.
        env: this rank's world (world size, this node's count and the launcher's name).
        layout: the per-node counts every rank knows (:func:`launcher_layout`, :func:`exchanged_layout`).
        local_source: the variable that gave this node's count, for messages.
        world_source: the variable that gave the world size, for messages.
    """
    world, launcher = env.world_size, env.launcher
    asked = f"Trainer(devices={devices}, num_nodes={num_nodes}) asks for {num_nodes} node(s) of {devices} process(es)"
    if layout.uneven:
        return uneven_conflict(env, layout, local_source)
    if layout.counts is not None:
        per, nodes = layout.counts[0], len(layout.counts)
        if (devices, num_nodes) == (per, nodes):
            return None
        change = [
            f"{name}={good}"
            for name, good, bad in (("devices", per, devices), ("num_nodes", nodes, num_nodes))
            if good != bad
        ]
        return ConflictingEnvError(
            f"{asked}, but the launcher started {_plural(nodes, 'node')} of {per} ({world} in all; {layout.source}).",
            variables=(local_source, world_source),
            why=SHARDS + "Lightning would wait for processes that were never started, or leave data out.",
            fix=f"set {' and '.join(change)}; or start {num_nodes} node(s) of {devices} with the launcher: "
            f"{launch_flags(launcher, num_nodes, devices)}.",
        )
    if devices * num_nodes != world:
        return ConflictingEnvError(
            f"{asked} ({devices * num_nodes} in all), but the launcher started {world} ({world_source}={world}).",
            variables=(world_source,),
            why=SHARDS + "Lightning would wait for processes that were never started, or leave data out.",
            fix=f"set num_nodes to the number of nodes and devices to the processes per node, so that "
            f"devices * num_nodes = {world}.",
        )
    lws = env.local_world_size
    if lws is not None and lws != devices:
        return ConflictingEnvError(
            f"devices={devices}, but the launcher started {lws} process(es) on this node ({local_source}={lws}).",
            variables=(local_source,),
            why="with DistinitEnvironment the launcher starts every process and each drives one device; "
            "Lightning starts none of its own.",
            fix=f"set devices={lws}, or start {devices} processes per node with the launcher: "
            f"{launch_flags(launcher, num_nodes, devices)}.",
        )
    return None
