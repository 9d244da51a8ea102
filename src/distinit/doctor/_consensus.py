"""``consensus``: every rank runs the same versions and backends, with the same NCCL/GLOO/TORCH variables."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from distinit.doctor._model import Check

PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
#: Variables that may differ between hosts on purpose (interface names differ by machine): a warning only.
PER_HOST_SUFFIXES = ("_SOCKET_IFNAME",)
UNSET = "<unset>"
#: Longest value quoted from a variable (the whole value goes into the digest).
VALUE_LIMIT = 200


def _nccl_version() -> str:
    import torch.cuda.nccl

    found: object = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def local_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This rank's versions, available backends and NCCL_*/GLOO_*/TORCH_* variables."""
    import torch
    import torch.distributed as dist

    env = os.environ if environ is None else environ
    try:
        nccl: str | None = _nccl_version() if torch.cuda.is_available() else None
    except (RuntimeError, AttributeError):
        nccl = None
    try:
        ours: str | None = metadata.version("distinit")
    except metadata.PackageNotFoundError:
        ours = None
    variables = {k: v[:VALUE_LIMIT] for k, v in sorted(env.items()) if k.startswith(PREFIXES)}
    digest = hashlib.sha256(json.dumps(variables, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "distinit": ours,
            "cuda": torch.version.cuda,
            "nccl": nccl,
            "platform": sys.platform,
        },
        "backends": {name: bool(getattr(dist, f"is_{name}_available")()) for name in ("gloo", "nccl", "mpi", "ucc")},
        "variables": variables,
        "digest": digest,
    }


def _items(facts: Mapping[str, Any]) -> dict[str, str]:
    found = {f"version {k}": str(v) for k, v in facts["versions"].items()}
    found.update({f"backend {k}": "available" if v else "missing" for k, v in facts["backends"].items()})
    found.update({k: str(v) for k, v in facts["variables"].items()})
    return found


def differences(per_rank: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each item on which the ranks disagree, with the majority value and the minority ranks' values.

    The majority is the largest group of ranks sharing a value (ties go to rank 0's value).
    """
    items = {rank: _items(facts) for rank, facts in per_rank.items()}
    names = sorted({name for found in items.values() for name in found})
    found = []
    for name in names:
        groups: dict[str, list[int]] = {}
        for rank in sorted(items):
            groups.setdefault(items[rank].get(name, UNSET), []).append(rank)
        if len(groups) < 2:
            continue
        first = min(items)
        majority = max(groups, key=lambda value: (len(groups[value]), first in groups[value]))
        minority = {rank: value for value, ranks in groups.items() if value != majority for rank in ranks}
        found.append(
            {"item": name, "majority": majority, "majority_ranks": len(groups[majority]), "minority": minority}
        )
    return found


def _set_per_host(
    found: list[dict[str, Any]], per_rank: Mapping[int, Mapping[str, Any]], *, host_of: Mapping[int, str]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """``found`` without the ``*_SOCKET_IFNAME`` variables that are set per host (one value on each host).

    Interface names differ between machines (``eth0`` here, ``ens5`` there): a value that is the same for
    every rank of a host is the user's per-host choice, not a disagreement. Returns the rest, and the
    per-host values (evidence).
    """
    kept, per_host = [], {}
    for diff in found:
        name = diff["item"]
        if name.endswith(PER_HOST_SUFFIXES):
            by_host: dict[str, set[str]] = {}
            for rank, facts in per_rank.items():
                by_host.setdefault(host_of.get(rank, "?"), set()).add(str(facts["variables"].get(name, UNSET)))
            if "?" not in by_host and all(len(values) == 1 for values in by_host.values()):
                per_host[name] = {host: next(iter(values)) for host, values in sorted(by_host.items())}
                continue
        kept.append(diff)
    return kept, per_host


def consensus(per_rank: Mapping[int, Mapping[str, Any]], *, host_of: Mapping[int, str]) -> Check:
    """The ``consensus`` check; the minority of every disagreement is named by rank, host and value."""
    found, per_host = _set_per_host(differences(per_rank), per_rank, host_of=host_of)
    digests: dict[str, list[int]] = {}
    for rank, facts in sorted(per_rank.items()):
        digests.setdefault(str(facts["digest"]), []).append(rank)
    evidence: dict[str, Any] = {"differences": found, "variable_digests": digests, "per_host": per_host}
    if not found:
        return Check(
            id="consensus",
            status="pass",
            summary=f"{len(per_rank)} ranks agree on versions, backends and NCCL_*/GLOO_*/TORCH_* variables",
            evidence=evidence,
        )
    hard = [d for d in found if not d["item"].endswith(PER_HOST_SUFFIXES)]
    lines = []
    for diff in found[:6]:
        minority = sorted(diff["minority"].items())
        who = ", ".join(f"rank {r} ({host_of.get(r, '?')}) {v!r}" for r, v in minority[:4])
        more = f" and {len(minority) - 4} more" if len(minority) > 4 else ""
        lines.append(f"{diff['item']}: {who}{more} vs {diff['majority']!r} on {diff['majority_ranks']} ranks")
    ranks = tuple(sorted({r for d in found for r in d["minority"]}))
    return Check(
        id="consensus",
        status="fail" if hard else "warn",
        summary="ranks disagree: " + "; ".join(lines),
        fix="launch every rank with the same software and NCCL_*/GLOO_*/TORCH_* variables (export them in the job "
        "script, pass them with `mpirun -x` / `srun --export`); interface names may differ by host on purpose",
        ranks=ranks,
        hosts=tuple(sorted({host_of.get(r, "?") for r in ranks})),
        evidence=evidence,
    )
