"""World verdicts built from what every rank sent: local checks merged, host-pair probes summed up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from distinit._identity import NodeLayout
from distinit.doctor._model import LOCAL_IDS, Check, worst
from distinit.doctor._peer import PeerLocal
from distinit.doctor._reach import FULL_MESH_HOSTS, SAMPLED_PEERS

#: Ranks quoted by name in one merged summary.
QUOTED = 4


def _merge_one(check_id: str, checks: Mapping[int, Check], host_of: Mapping[int, str]) -> Check:
    status = worst([c.status for c in checks.values()])
    first = checks[min(checks)]
    if status in ("pass", "skip"):
        same = "all ranks" if len({c.summary for c in checks.values()}) == 1 else f"rank {min(checks)}"
        return Check(id=check_id, status=status, summary=f"{same}: {first.summary}", evidence=first.evidence)
    bad = {r: c for r, c in sorted(checks.items()) if c.status == status}
    quoted = "; ".join(f"rank {r} ({host_of.get(r, '?')}): {c.summary}" for r, c in list(bad.items())[:QUOTED])
    more = f"; and {len(bad) - QUOTED} more rank(s)" if len(bad) > QUOTED else ""
    if len(bad) > 1 and len({c.summary for c in bad.values()}) == 1:  # one cause on many ranks: said once
        hosts = list(dict.fromkeys(host_of.get(r, "?") for r in bad))
        shown = f"{', '.join(hosts[:QUOTED])}{f' and {len(hosts) - QUOTED} more' if len(hosts) > QUOTED else ''}"
        ranks = f"{list(bad)[: 2 * QUOTED]}{f' and {len(bad) - 2 * QUOTED} more' if len(bad) > 2 * QUOTED else ''}"
        quoted, more = f"ranks {ranks} ({shown}): {bad[min(bad)].summary}", ""
    return Check(
        id=check_id,
        status=status,
        summary=quoted + more,
        fix=next(iter(bad.values())).fix,
        ranks=tuple(bad),
        hosts=tuple(dict.fromkeys(host_of.get(r, "?") for r in bad)),
        evidence={"by_rank": {str(r): c.evidence for r, c in list(bad.items())[:16]}},
    )


#: A world that did not form for a reason a local check already failed on is that failure, not another one:
#: (local check id, words in the world's error that show the same cause).
CAUSES = (
    ("route", ("_SOCKET_IFNAME",)),
    ("names", ("loopback", "resolve")),
)


def follows_from(world: Check, local: Sequence[Check]) -> Check:
    """``world`` (failed: the group did not form) as a ``skip`` pointing at the local failure that caused it.

    One cause, one failure: a bad ``GLOO_SOCKET_IFNAME`` fails ``route`` and stops the rendezvous; the
    report says so once, with the world's error kept as evidence. ``world`` is returned as it is when no
    local failure explains it.
    """
    said = f"{world.summary} {world.evidence.get('error', '')}"
    failed = {c.id for c in local if c.status == "fail"}
    for check_id, words in CAUSES:
        if check_id in failed and any(word in said for word in words):
            return Check(
                id="world",
                status="skip",
                summary=f"did not form, because of the {check_id} failure: {world.summary}",
                ranks=world.ranks,
                evidence={**world.evidence, "caused_by": check_id, "summary": world.summary, "fix": world.fix},
            )
    return world


def unformed_world(world: Check, shared: Mapping[int, PeerLocal | str]) -> list[Check]:
    """Rank 0's report when the world did not form: ``world``, then every answering rank's local checks merged.

    The local checks come from :func:`distinit.doctor._postmortem.share_local`. A rank that sent something
    unusable is named in ``world``'s evidence (``merged_ranks`` lists the ranks merged).
    """
    usable = {r: p for r, p in shared.items() if isinstance(p, PeerLocal)}
    host_of = {r: p.host for r, p in usable.items()}
    merged = merge_local({r: [c.model_dump(mode="json") for c in p.local] for r, p in usable.items()}, host_of=host_of)
    unusable = {str(r): why for r, why in shared.items() if isinstance(why, str)}
    evidence = {**world.evidence, "merged_ranks": sorted(usable), "unusable_local_checks": unusable}
    shown = Check.model_validate({**world.model_dump(), "evidence": evidence})
    return [shown, *merged]


def merge_local(per_rank: Mapping[int, Sequence[Mapping[str, Any]]], *, host_of: Mapping[int, str]) -> list[Check]:
    """One verdict per local check id over every rank's: the worst status, naming the ranks that have it."""
    by_id: dict[str, dict[int, Check]] = {}
    for rank, dumps in per_rank.items():
        for dump in dumps:
            check = Check.model_validate(dump)
            by_id.setdefault(check.id, {})[rank] = check
    merged = [_merge_one(i, by_id[i], host_of) for i in LOCAL_IDS if i in by_id]
    sharing = shared_devices(per_rank, host_of=host_of)
    return [sharing if sharing is not None and c.id == "gpu" and c.status != "fail" else c for c in merged]


def one_kernel(layout: NodeLayout) -> bool:
    """True when every host of ``layout`` runs on one kernel in one network namespace (fake nodes)."""
    kernels = {(h.identity.boot_id, h.identity.netns) for h in layout.hosts}
    return len(kernels) == 1 and None not in next(iter(kernels))


def excuse_loopback(
    per_rank: Mapping[int, Sequence[Mapping[str, Any]]], *, layout: NodeLayout
) -> dict[int, list[Mapping[str, Any]]]:
    """``per_rank`` with each loopback-only ``names`` failure made a warning when all hosts share one kernel.

    In one kernel and one network namespace (fake nodes, containers) loopback reaches every rank.
    """
    excused = one_kernel(layout)

    def judged(dump: Mapping[str, Any]) -> Mapping[str, Any]:
        evidence = dump.get("evidence", {})
        if not excused or dump.get("id") != "names" or dump.get("status") != "fail":
            return dump
        if not evidence.get("loopback") or len(evidence["loopback"]) != evidence.get("problems"):
            return dump
        summary = f"{dump['summary']}; works only because all hosts share one kernel and network namespace"
        return {**dump, "status": "warn", "summary": summary, "fix": f"on separate machines: {dump['fix']}"}

    return {rank: [judged(d) for d in dumps] for rank, dumps in per_rank.items()}


def shared_devices(per_rank: Mapping[int, Sequence[Mapping[str, Any]]], *, host_of: Mapping[int, str]) -> Check | None:
    """A ``gpu`` failure when two ranks of one host drive the same device (same UUID), else None."""
    owners: dict[tuple[str, str], list[int]] = {}
    for rank, dumps in sorted(per_rank.items()):
        for dump in dumps:
            uuid = dump.get("evidence", {}).get("uuid") if dump.get("id") == "gpu" else None
            if uuid:
                owners.setdefault((host_of.get(rank, "?"), str(uuid)), []).append(rank)
    shared = {key: ranks for key, ranks in owners.items() if len(ranks) > 1}
    if not shared:
        return None
    named = "; ".join(f"ranks {ranks} on {host} share device {uuid}" for (host, uuid), ranks in shared.items())
    return Check(
        id="gpu",
        status="fail",
        summary=named,
        fix="give each local rank its own device: torch.cuda.set_device(local_rank), one CUDA_VISIBLE_DEVICES "
        "entry per task (srun --gpus-per-task=1), or fewer ranks per host",
        ranks=tuple(sorted(r for ranks in shared.values() for r in ranks)),
        hosts=tuple(dict.fromkeys(host for host, _ in shared)),
        evidence={"shared": [{"host": h, "uuid": u, "ranks": r} for (h, u), r in shared.items()]},
    )


def reach_check(led: Mapping[str, Mapping[str, Any]], *, ranks_of: Mapping[str, tuple[int, ...]]) -> Check:
    """``reach`` over every host's probe results (host label -> its leader's results)."""
    tested = sum(int(res.get("reach_tested", 0)) for res in led.values())
    plan = "all pairs" if len(led) <= FULL_MESH_HOSTS else f"ring + {SAMPLED_PEERS} random peers per host"
    if len(led) < 2:
        return Check(id="reach", status="skip", summary="a single host: no host pair to test")
    failures = [(src, dst, why) for src, res in sorted(led.items()) for dst, why in res.get("reach_failures", [])]
    evidence = {"hosts": len(led), "pairs_tested": tested, "plan": plan, "failures": [list(f) for f in failures]}
    if not failures:
        return Check(id="reach", status="pass", summary=f"{tested} host pairs connect ({plan})", evidence=evidence)
    named = "; ".join(f"{src} -> {dst}: {why}" for src, dst, why in failures[:8])
    more = f"; and {len(failures) - 8} more" if len(failures) > 8 else ""
    hosts = tuple(dict.fromkeys(h for src, dst, _ in failures for h in (src, dst)))
    return Check(
        id="reach",
        status="fail",
        summary=f"{len(failures)} of {tested} host pairs cannot connect: {named}{more}",
        fix="allow TCP between these hosts on the ports gloo/NCCL pick (the ephemeral range) on the interface of "
        "GLOO_SOCKET_IFNAME; `nc -zv <host> <port>` from the first host reproduces it",
        ranks=tuple(sorted(r for h in hosts for r in ranks_of.get(h, ()))),
        hosts=hosts,
        evidence=evidence,
    )


def bandwidth_check(led: Mapping[str, Mapping[str, Any]], *, ranks_of: Mapping[str, tuple[int, ...]]) -> Check:
    """``bandwidth``: GB/s of each ring link; a link under half the median, or failing, is named."""
    links = {src: res["bandwidth"] for src, res in sorted(led.items()) if "bandwidth" in res}
    if not links:
        return Check(id="bandwidth", status="skip", summary="a single host: no link to measure")
    rates = sorted(float(v[1]) for v in links.values() if not isinstance(v[1], str))
    median = rates[len(rates) // 2] if rates else 0.0
    table = {f"{src} -> {dst}": rate for src, (dst, rate) in links.items()}
    bad = {k: v for k, v in table.items() if isinstance(v, str) or v < median / 2}
    evidence = {"gb_per_s": table, "median_gb_per_s": median}
    if not bad:
        return Check(
            id="bandwidth", status="pass", summary=f"{len(table)} links, median {median:.2f} GB/s", evidence=evidence
        )
    shown = "; ".join(f"{k}: {v if isinstance(v, str) else f'{v:.2f} GB/s'}" for k, v in bad.items())
    hosts = tuple(dict.fromkeys(h for k in bad for h in k.split(" -> ")))
    return Check(
        id="bandwidth",
        status="warn",
        summary=f"slow or failing links (median {median:.2f} GB/s): {shown}",
        fix="check these links' NIC speed, duplex and MTU (`ethtool`, `ip link`), and competing traffic",
        ranks=tuple(sorted(r for h in hosts for r in ranks_of.get(h, ()))),
        hosts=hosts,
        evidence=evidence,
    )
