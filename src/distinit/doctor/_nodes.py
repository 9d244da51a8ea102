"""``nodes``: ranks grouped by host identity against the node rank, local ranks and node count they claim."""

from __future__ import annotations

from distinit._identity import NodeLayout
from distinit.doctor._model import Check


def nodes(layout: NodeLayout) -> Check:
    """The ``nodes`` check over a :func:`distinit._identity.group_ranks` layout."""
    evidence = {
        "hosts": [{"host": h.label, "node_rank": h.node_rank, "ranks": list(h.ranks)} for h in layout.hosts],
        "conflicts": [c.model_dump(mode="json") for c in layout.conflicts],
        "notes": list(layout.notes),
    }
    if layout.conflicts:
        return Check(
            id="nodes",
            status="fail",
            summary="; ".join(c.message for c in layout.conflicts[:4]),
            fix="each host needs its own node rank and local ranks 0..n-1: take them from the launcher "
            "(`distinit env --explain` shows where each came from); under Open MPI do not export NODE_RANK "
            "to every node (Lightning assumes node 0 when it cannot tell)",
            ranks=tuple(sorted({r for c in layout.conflicts for r in c.ranks})),
            hosts=tuple(dict.fromkeys(h for c in layout.conflicts for h in c.hosts)),
            evidence=evidence,
        )
    shape = ", ".join(f"{h.label}: {len(h.ranks)}" for h in layout.hosts[:8])
    more = f", ... ({layout.num_nodes} hosts)" if layout.num_nodes > 8 else ""
    note = f"; note: {layout.notes[0]}" if layout.notes else ""
    return Check(
        id="nodes",
        status="pass",
        summary=f"{layout.num_nodes} host(s) ({shape}{more}) match the node and local ranks{note}",
        evidence=evidence,
    )
