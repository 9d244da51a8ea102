"""``run()``: the local checks, then the world checks, each bounded inside one overall timeout."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from distinit._duration import to_seconds
from distinit._foreign import first_line
from distinit._identity import local_identity
from distinit.doctor._consensus import local_facts
from distinit.doctor._listener import Listener, gloo_address
from distinit.doctor._local import check_env, run_local
from distinit.doctor._merge import follows_from, unformed_world
from distinit.doctor._model import ALL_IDS, WORLD_IDS, Check, DoctorReport, OnCheck, make_report
from distinit.doctor._nccl import local_device
from distinit.doctor._postmortem import SHARE_S, share_local
from distinit.doctor._world import claim_of, form_world, leave_world, skipped, world_checks
from distinit.env import DistEnv

#: Share of the timeout kept back from the rendezvous for the checks after it (at most RESERVE_CAP s).
RESERVE_SHARE = 0.3
RESERVE_CAP = 15.0
#: World failures at the rendezvous endpoint (``MASTER_ADDR:MASTER_PORT``), where no post-mortem merge can go.
ENDPOINT_ERRORS = ("PortInUseError:", "MasterUnreachableError:")


@dataclass(frozen=True)
class Options:
    """What the caller asked for beyond the defaults."""

    bandwidth: bool
    nccl: bool
    skip: frozenset[str]


def world_ids(*, bandwidth: bool, nccl: bool) -> list[str]:
    """The world check ids this run reports (``world`` first; the opt-in ones only when asked for)."""
    return [i for i in WORLD_IDS if (bandwidth or i != "bandwidth") and (nccl or i != "nccl")]


def _tell(on_check: OnCheck | None, checks: Sequence[Check]) -> list[Check]:
    """Hand ``checks`` to ``on_check`` (if any) in order; return them."""
    if on_check is not None:
        for check in checks:
            on_check(check)
    return list(checks)


def _skip_set(skip: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(s.strip() for s in skip if s.strip())
    unknown = sorted(chosen - set(ALL_IDS))
    if unknown:
        raise ValueError(f"unknown check id(s) {unknown}; the ids are {', '.join(ALL_IDS)}")
    return chosen


def _broken_world(rank: int, exc: Exception) -> tuple[Check, str]:
    """The world check when the world formed and then a world check raised ``exc``, and what went wrong."""
    # torch's collective errors are RuntimeError: a peer closed its connection or never answered.
    # Peers' documents are validated, so anything else here is the doctor's own bug.
    collective = isinstance(exc, RuntimeError)
    what = "a collective failed" if collective else "the doctor failed"
    broken = Check(
        id="world",
        status="fail",
        summary=f"the world formed, then {what}: {type(exc).__name__}: {first_line(exc)}",
        fix="another rank stopped or ran out of time: read its output (every rank prints one line)"
        if collective
        else "report this as a distinit bug, with every rank's `distinit doctor --json` output",
        ranks=(rank,),
        evidence={"error": str(exc)[:4096]},
    )
    return broken, what


def _world(
    env: DistEnv,
    *,
    local: list[Check],
    environ: Mapping[str, str],
    end: float,
    options: Options,
    on_check: OnCheck | None,
) -> list[Check]:
    """The world's checks (merged local ones first), or this rank's local checks and why the world failed."""

    def budget() -> float:
        return end - time.monotonic()

    def failed(world: Check, why: str) -> list[Check]:
        rest = skipped(world_ids(bandwidth=options.bandwidth, nccl=options.nccl)[1:], why)
        # The rendezvous endpoint itself failed (held by another program, unreachable): a merge through it
        # would only wait again and add torch's native connect trace to every rank's output.
        endpoint = world.summary.startswith(ENDPOINT_ERRORS)
        world = follows_from(world, local)
        shared = None if endpoint else share_local(env, local, host=identity.hostname, timeout=min(SHARE_S, budget()))
        if shared is None:  # a rank other than 0, or nothing to merge: this rank's own checks
            return [*local, *_tell(on_check, [world, *rest])]
        return _tell(on_check, [*unformed_world(world, shared), *rest])

    identity = local_identity(environ)
    reserve = min(RESERVE_CAP, RESERVE_SHARE * budget())
    listener = Listener(gloo_address(environ, identity.hostname))
    checks: list[Check] = []
    try:
        created, world = form_world(env, deadline=max(1.0, budget() - reserve), pg_timeout=max(1.0, reserve))
        if world.status != "pass":
            return failed(world, "the world did not form")
        _tell(on_check, [world])
        try:
            payload = {
                "claim": claim_of(env, identity),
                "facts": local_facts(environ),
                "local": [c.model_dump(mode="json") for c in local],
                "cuda_device": local_device(env.local_rank) if options.nccl else None,
            }
            checks = world_checks(
                env,
                payload=payload,
                listener=listener,
                budget=budget,
                bandwidth=options.bandwidth,
                nccl=options.nccl,
                skip=options.skip,
                on_check=on_check,
            )
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            return failed(*_broken_world(env.rank, exc))
        finally:
            # an NCCL collective that never answered (bounded()'s timeout verdict) may still hold the group
            leave_world(created, stuck=any(c.id == "nccl" and "waiting_for" in c.evidence for c in checks))
    finally:
        listener.close()
    return sorted([world, *checks], key=lambda c: ALL_IDS.index(c.id))


def run(
    *,
    timeout: float | timedelta = 60.0,
    bandwidth: bool = False,
    nccl: bool = False,
    skip: Iterable[str] = (),
    strict: bool = True,
    environ: Mapping[str, str] | None = None,
    on_check: OnCheck | None = None,
) -> DoctorReport:
    """Run the doctor on this rank; every rank of the world must call it (as the job would start).

    Local checks first (no network), then, through one gloo group formed by ``init_with_retry``, the world
    checks. Each check is bounded inside ``timeout``; one that runs out fails, naming what it waited for.
    A process group this process already holds is reused and left in place.

    Args:
        timeout: seconds (or ``timedelta``) for the whole doctor.
        bandwidth: also measure each host's link to the next (64 MiB each).
        nccl: also run one small all_reduce on an NCCL group (``skip`` where no rank has a GPU).
        skip: check ids not to run (see ``docs/doctor.md``).
        strict: ``False`` treats "not launched" as a world of one process.
        environ: the variables to read; default ``os.environ``.
        on_check: called on rank 0 only (and on a rank whose environment did not resolve) with each
            verdict as it completes: this rank's local checks, then the world's.

    Returns:
        The world's :class:`DoctorReport` on every rank once the world formed, else this rank's own.

    Raises:
        ValueError: an unknown id in ``skip``, or a bad ``timeout``.
        TypeError: ``timeout`` is not seconds or a ``timedelta``.
    """
    seconds = to_seconds(timeout, "timeout")
    options = Options(bandwidth=bandwidth, nccl=nccl, skip=_skip_set(skip))
    import torch  # noqa: F401  # imported before the clock starts: seconds on a loaded host, and no check's cost

    started = time.monotonic()
    end = started + seconds
    variables = dict(os.environ if environ is None else environ)
    env, local = _local(variables, strict=strict, end=end, skip=options.skip, on_check=on_check)
    if env is not None and env.rank != 0:
        on_check = None  # rank 0 reports the world; the others print one line at the end
    if env is None or "world" in options.skip:
        why = "the environment could not be resolved" if env is None else "skipped (--skip world)"
        checks = [*local, *_tell(on_check, skipped(world_ids(bandwidth=bandwidth, nccl=nccl), why))]
    else:
        checks = _world(env, local=local, environ=variables, end=end, options=options, on_check=on_check)
    return make_report(
        checks,
        world_size=env.world_size if env else 1,
        rank=env.rank if env else 0,
        elapsed_s=time.monotonic() - started,
    )


def _local(
    variables: Mapping[str, str], *, strict: bool, end: float, skip: frozenset[str], on_check: OnCheck | None
) -> tuple[DistEnv | None, list[Check]]:
    """The resolved world and this rank's local checks; only rank 0 (or an unresolved rank) tells ``on_check``."""

    def budget() -> float:
        return end - time.monotonic()

    env, env_check = check_env(strict=strict, environ=variables)
    if env is not None and env.rank != 0:
        on_check = None
    if "env" in skip:
        env_check = Check(id="env", status="skip", summary="skipped (--skip)")
    _tell(on_check, [env_check])
    identity = local_identity(variables)
    rest = run_local(env, identity=identity, environ=variables, budget=budget, skip=skip, on_check=on_check)
    return env, [env_check, *rest]
