"""The world checks: one gloo group, two JSON exchanges, and the host-to-host probes in between."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from distinit._foreign import first_line
from distinit._identity import HostIdentity, NodeLayout, group_ranks
from distinit._identity import claim_of as rank_claim
from distinit.doctor import _clock, _reach
from distinit.doctor._consensus import consensus
from distinit.doctor._exchange import destroy_world, gather_bytes
from distinit.doctor._listener import Listener
from distinit.doctor._merge import bandwidth_check, excuse_loopback, merge_local, reach_check
from distinit.doctor._model import Check, OnCheck, from_error
from distinit.doctor._nccl import check_nccl
from distinit.doctor._nodes import nodes
from distinit.doctor._peer import PeerDocument, parse_document, parse_results, peer_failure
from distinit.env import DistEnv
from distinit.errors import DistinitError

#: Bytes each host sends its ring successor under ``--bandwidth``.
BANDWIDTH_BYTES = 64 * 1024 * 1024


def claim_of(env: DistEnv, identity: HostIdentity) -> dict[str, Any]:
    """This rank's identity claim, as JSON (the same claim ``setup()`` verifies the world with)."""
    return rank_claim(env, {}, identity).model_dump(mode="json")


def _probe_hosts(
    me: int,
    layout: NodeLayout,
    endpoints: Mapping[int, _reach.Endpoint],
    *,
    pair_timeout: float,
    bandwidth: bool,
    skip: frozenset[str],
) -> dict[str, Any]:
    """This rank's share of reach/clock/bandwidth: nothing unless it leads its host (its lowest rank)."""
    leaders = [h.ranks[0] for h in layout.hosts]
    if me not in leaders:
        return {}
    index = leaders.index(me)
    targets = [] if "reach" in skip else _reach.reach_plan(len(leaders))[index]
    outcome = _reach.probe_all([endpoints[leaders[j]] for j in targets], timeout=pair_timeout)
    result: dict[str, Any] = {
        "reach_tested": len(targets),
        "reach_failures": [[layout.hosts[j].label, why] for j, why in zip(targets, outcome, strict=True) if why],
        "clock": None if "clock" in skip else _clock.measure(endpoints[0], timeout=pair_timeout),
    }
    if bandwidth and len(leaders) > 1:
        successor = (index + 1) % len(leaders)
        result["bandwidth"] = [
            layout.hosts[successor].label,
            _reach.transfer(endpoints[leaders[successor]], size_bytes=BANDWIDTH_BYTES, timeout=max(pair_timeout, 10.0)),
        ]
    return result


class _Emitter:
    """Collects world verdicts (``skip`` for ids in ``skip``) and hands each to ``on_check`` at once."""

    def __init__(self, skip: frozenset[str], on_check: OnCheck | None) -> None:
        self.skip, self.on_check, self.checks = skip, on_check, list[Check]()

    def __call__(self, check: Check) -> None:
        shown = Check(id=check.id, status="skip", summary="skipped (--skip)") if check.id in self.skip else check
        self.checks.append(shown)
        if self.on_check is not None:
            self.on_check(shown)


def world_checks(
    env: DistEnv,
    *,
    payload: dict[str, Any],
    listener: Listener,
    budget: Callable[[], float],
    bandwidth: bool,
    nccl: bool = False,
    skip: frozenset[str] = frozenset(),
    on_check: OnCheck | None = None,
) -> list[Check]:
    """Exchange ``payload`` (facts and local checks), probe, exchange results; every check of the world.

    Verdicts reach ``on_check`` as they are known: merged local checks, ``consensus`` and ``nodes`` after
    the first exchange; ``clock``, ``reach`` and ``bandwidth`` after the probes; ``nccl`` last.
    """
    emit = _Emitter(skip, on_check)
    op_timeout = max(1.0, min(10.0, budget() / 4))
    sent = gather_bytes(
        {**payload, "endpoint": [listener.address, listener.port]}, world_size=env.world_size, timeout=op_timeout
    )
    parsed = {r: parse_document(raw, rank=r, world_size=env.world_size) for r, raw in enumerate(sent)}
    bad = {r: why for r, why in parsed.items() if isinstance(why, str)}
    by_rank = {doc.claim.rank: doc for doc in parsed.values() if isinstance(doc, PeerDocument)}
    layout = group_ranks([doc.claim for doc in parsed.values() if isinstance(doc, PeerDocument)])
    host_of = {r: h.label for h in layout.hosts for r in h.ranks}
    local = {r: [c.model_dump(mode="json") for c in d.local] for r, d in by_rank.items()}
    for check in merge_local(excuse_loopback(local, layout=layout), host_of=host_of):
        emit(check)
    if bad:  # every rank saw the same bytes: every rank stops here, with the same verdict
        emit(peer_failure(bad, host_of=host_of))
        why = f"skipped: rank(s) {sorted(bad)} sent no valid document (see consensus)"
        rest = ["nodes", "clock", "reach", *(["bandwidth"] if bandwidth else []), *(["nccl"] if nccl else [])]
        for check in skipped(rest, why):
            emit(check)
        return emit.checks
    emit(consensus({r: doc.facts.model_dump() for r, doc in by_rank.items()}, host_of=host_of))
    emit(nodes(layout))
    endpoints = {r: (doc.endpoint[0], doc.endpoint[1]) for r, doc in by_rank.items()}
    pair_timeout = max(0.5, min(3.0, budget() / 4))
    mine = _probe_hosts(env.rank, layout, endpoints, pair_timeout=pair_timeout, bandwidth=bandwidth, skip=skip)
    returned = gather_bytes(mine, world_size=env.world_size, timeout=max(1.0, min(10.0, budget())))
    results = [_results_of(r, raw) for r, raw in enumerate(returned)]
    leaders = {h.ranks[0]: h for h in layout.hosts}
    led = {leaders[r].label: res for r, res in enumerate(results) if r in leaders}
    ranks_of = {h.label: h.ranks for h in layout.hosts}
    offsets = {h: res["clock"] for h, res in led.items()}
    emit(_clock.verdict(offsets, ranks_of=ranks_of, reference=layout.hosts[0].label))
    emit(reach_check(led, ranks_of=ranks_of))
    if bandwidth:
        emit(bandwidth_check(led, ranks_of=ranks_of))
    if nccl:
        devices = {r: doc.cuda_device for r, doc in by_rank.items()}
        emit(
            Check(id="nccl", status="skip", summary="skipped (--skip)")
            if "nccl" in skip
            else check_nccl(devices, rank=env.rank, budget=budget())
        )
    return emit.checks


def _results_of(rank: int, raw: bytes | None) -> dict[str, Any]:
    """Rank ``rank``'s probe results as the verdicts read them; invalid ones become its clock's failure."""
    found = parse_results(raw)
    if isinstance(found, str):
        return {"clock": f"rank {rank} {found}"}
    return found.model_dump(exclude_none=True) | {"clock": found.clock}


def form_world(env: DistEnv, *, deadline: float, pg_timeout: float) -> tuple[bool, Check]:
    """Join the gloo group through ``init_with_retry``; (we created it, the ``world`` verdict)."""
    import torch.distributed as dist

    from distinit.init import init_with_retry

    created = not dist.is_initialized()
    started = time.monotonic()
    try:
        init_with_retry(
            "gloo", env=env, deadline=deadline, attempt_timeout=min(30.0, deadline), pg_timeout=pg_timeout, verify=False
        )
    except DistinitError as exc:
        fix = "see the message; `distinit env --check` runs the rendezvous alone"
        return False, from_error("world", exc, fix=fix, ranks=(env.rank,))
    except (RuntimeError, ValueError, OSError) as exc:  # torch's own failures after the rendezvous
        return False, Check(
            id="world",
            status="fail",
            summary=f"{type(exc).__name__}: {first_line(exc)}",
            fix="see the message; run `distinit env --check` for the rendezvous alone",
            ranks=(env.rank,),
        )
    elapsed = time.monotonic() - started
    summary = f"{env.world_size} ranks formed a gloo group in {elapsed:.2f} s"
    return created, Check(id="world", status="pass", summary=summary, evidence={"elapsed_s": round(elapsed, 4)})


def leave_world(created: bool, *, stuck: bool = False) -> None:
    """Destroy the group if this doctor created it (a training script's own group is left alone).

    ``stuck``: an NCCL collective never finished; destroying its group could block, so all is left.
    """
    import torch.distributed as dist

    if created and not stuck and dist.is_initialized():
        destroy_world()


def skipped(ids: Sequence[str], why: str) -> list[Check]:
    """A ``skip`` verdict for each of ``ids``."""
    return [Check(id=i, status="skip", summary=why) for i in ids]
