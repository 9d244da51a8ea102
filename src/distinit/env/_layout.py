"""Node rank from an MPI launcher's rank layout: derived by a named rule, or unknown with the reason.

Open MPI, MPICH hydra, MVAPICH2 and LSF jsrun export no node index. One rank sees its rank, local
rank and local size, the world size, and sometimes the node count (``OMPI_MCA_orte_num_nodes`` in
Open MPI 4.x) and Open MPI's mapping and ranking policies (``--map-by``, ``--rank-by``). Nodes are
numbered by their lowest global rank, as torchrun numbers its agents. From one rank's view:

- the whole world on this node: node 0 of 1 (certain);
- ``LOCAL_RANK == RANK``: every lower rank shares this node, so it holds rank 0: node 0 (certain);
- round-robin ranking (``--map-by node``, ``--rank-by node``): rank r on node ``r % N``, when the N
  nodes hold equal shares;
- block ranking (by slot, the default, or by any object inside a node): ``(RANK - LOCAL_RANK) /
  LOCAL_SIZE``, when the N nodes hold equal shares;
- otherwise unknown, with a note saying why.

The rules need the node count from the launcher: without it one rank cannot tell 2 + 2 from 1 + 1 + 2,
and the block rule would put the lone rank of hydra's ``-hosts a:3,b:1`` on node 3 of 2 nodes.
"""

from __future__ import annotations

from typing import Literal

from distinit.env._draft import Draft, Vars

#: Open MPI's policy variables, the ranking policy first: when given it decides the order of ranks.
#: The 4.x names are exported to the ranks by mpirun; the PRRTE (5.x) names when a user sets them.
_POLICIES = (
    "OMPI_MCA_rmaps_base_ranking_policy",
    "PRTE_MCA_rmaps_default_ranking_policy",
    "OMPI_MCA_rmaps_base_mapping_policy",
    "PRTE_MCA_rmaps_default_mapping_policy",
)
#: Policies that fill one node's objects before the next node: every node holds consecutive ranks.
_BLOCK_OBJECTS = frozenset(
    {"slot", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "package", "numa", "board", "ppr", "dist"}
)

Layout = Literal["block", "round-robin"]

_SETUP = "distinit.setup() derives it from the world once the group forms; or export NODE_RANK on each node."


def _policy(v: Vars) -> tuple[Layout | None, str]:
    """The layout Open MPI's policy implies, and the policy in words (``None``: no rule applies)."""
    # Read leniently: Open MPI takes an empty policy as none given, and the policy only picks a rule.
    found = next(((name, v.raw(name) or "") for name in _POLICIES if (v.raw(name) or "").strip()), None)
    if found is None:
        return "block", "placement by slot, the default"
    name, value = found
    words = [word.strip() for word in value.strip().lower().split(":")]
    kind = words[0].removeprefix("by")
    shown = f"{name}={v.quoted(name)}"
    if "span" in words[1:]:
        return None, f"{shown} spreads ranks over the objects of all nodes (span)"
    if kind == "node":
        return "round-robin", shown
    if kind in _BLOCK_OBJECTS or kind.startswith("pe-list"):
        return "block", shown
    return None, f"{shown} places ranks by a rule or file one rank cannot see"


def derive_node_rank(v: Vars, draft: Draft, *, family: str) -> None:
    """Set ``draft.node_rank`` by the first rule that holds (noted), or leave it unknown with a note.

    ``family`` names the launcher in the notes (``Open MPI``, ``MPICH hydra``...).
    """
    lws, local, world, rank = draft.local_world_size, draft.local_rank, draft.world_size, draft.rank
    if lws is None or local is None:
        draft.note(f"node_rank is unknown: {family} gives no local world size. {_SETUP}")
        return
    if lws == world:
        draft.put("node_rank", 0, "rule: whole world on this node")
        draft.put("num_nodes", 1, "rule: whole world on this node")
        draft.trusted_node_rank = True
        return
    draft.trusted_node_rank = False  # a rule, not the launcher's word: an exported NODE_RANK may replace it
    if local == rank:
        draft.put("node_rank", 0, "rule: LOCAL_RANK = RANK")
        draft.note(
            f"node_rank=0 by rule: local rank {local} = rank {rank}, so every lower rank runs on this node and it "
            "holds rank 0 (nodes are numbered by their lowest rank)."
        )
        return
    nodes = draft.num_nodes
    if nodes is None:
        draft.note(
            f"node_rank is unknown: {family} exports no node count, so rank {rank} cannot tell how the "
            f"{world - lws} ranks on other nodes are spread over them. {_SETUP}"
        )
        return
    layout, policy = _policy(v)
    even = nodes * lws == world
    if layout is None or not even:
        why = (
            policy if layout is None else f"{nodes} nodes of {lws} ranks are not the world of {world}: the nodes differ"
        )
        draft.note(f"node_rank is unknown: {why}. {_SETUP}")
        return
    node = _node(layout, rank=rank, local=local, nodes=nodes, lws=lws)
    if node is None:
        draft.note(
            f"node_rank is unknown: rank {rank} with local rank {local} does not fit a {layout} layout of {nodes} "
            f"nodes of {lws} ({policy}). {_SETUP}"
        )
        return
    formula = "RANK % nodes" if layout == "round-robin" else "(RANK - LOCAL_RANK) / LOCAL_WORLD_SIZE"
    draft.put("node_rank", node, f"rule: {layout} layout, {formula}", *draft.sources.get("num_nodes", ()))
    draft.note(
        f"node_rank={node} by the {layout} rule ({policy}): {formula} with {nodes} nodes of {lws} ranks each. It "
        "assumes every node holds the same number of ranks; export NODE_RANK if yours do not."
    )


def _node(layout: Layout, *, rank: int, local: int, nodes: int, lws: int) -> int | None:
    """Rank's node under ``layout`` with ``nodes`` nodes of ``lws`` ranks, if its local rank fits."""
    if layout == "round-robin":
        return rank % nodes if local == rank // nodes else None
    offset = rank - local
    return offset // lws if offset % lws == 0 else None
