"""``run()``: the local checks, then the world checks, each bounded inside one overall timeout."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta

from distinit._duration import to_seconds
from distinit._foreign import first_line
from distinit._identity import local_identity
from distinit.doctor._consensus import local_facts
from distinit.doctor._listener import Listener, gloo_address
from distinit.doctor._local import check_env, run_local
from distinit.doctor._model import ALL_IDS, WORLD_IDS, Check, DoctorReport, make_report
from distinit.doctor._world import claim_of, form_world, leave_world, skipped, world_checks
from distinit.env import DistEnv

#: Share of the timeout kept back from the rendezvous for the checks after it (at most RESERVE_CAP s).
RESERVE_SHARE = 0.3
RESERVE_CAP = 15.0


def _skip_set(skip: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(s.strip() for s in skip if s.strip())
    unknown = sorted(chosen - set(ALL_IDS))
    if unknown:
        raise ValueError(f"unknown check id(s) {unknown}; the ids are {', '.join(ALL_IDS)}")
    return chosen


def _world(
    env: DistEnv, *, local: list[Check], environ: Mapping[str, str], end: float, bandwidth: bool, skip: frozenset[str]
) -> list[Check]:
    """The world's checks (merged local ones first), or this rank's local checks and why the world failed."""

    def budget() -> float:
        return end - time.monotonic()

    wanted = [i for i in WORLD_IDS if i != "world" and (bandwidth or i != "bandwidth")]
    reserve = min(RESERVE_CAP, RESERVE_SHARE * budget())
    identity = local_identity(environ)
    listener = Listener(gloo_address(environ, identity.hostname))
    try:
        created, world = form_world(env, deadline=max(1.0, budget() - reserve), pg_timeout=max(1.0, reserve))
        if world.status != "pass":
            return [*local, world, *skipped(wanted, "the world did not form")]
        try:
            payload = {
                "claim": claim_of(env, identity),
                "facts": local_facts(environ),
                "local": [c.model_dump(mode="json") for c in local],
            }
            checks = world_checks(
                env, payload=payload, listener=listener, budget=budget, bandwidth=bandwidth, skip=skip
            )
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # a peer vanished or sent nonsense
            failed = Check(
                id="world",
                status="fail",
                summary=f"the world formed, then an exchange failed: {type(exc).__name__}: {first_line(exc)}",
                fix="another rank stopped or ran out of time: read its output (every rank prints one line)",
                ranks=(env.rank,),
            )
            return [*local, failed, *skipped(wanted, "the exchange failed")]
        finally:
            leave_world(created)
    finally:
        listener.close()
    return sorted([world, *checks], key=lambda c: ALL_IDS.index(c.id))


def run(
    *,
    timeout: float | timedelta = 60.0,
    bandwidth: bool = False,
    skip: Iterable[str] = (),
    strict: bool = True,
    environ: Mapping[str, str] | None = None,
) -> DoctorReport:
    """Run the doctor on this rank; every rank of the world must call it (as the job would start).

    Local checks first (no network), then, through one gloo group formed by ``init_with_retry``, the world
    checks. Each check is bounded inside ``timeout``; one that runs out fails, naming what it waited for.
    A process group this process already holds is reused and left in place.

    Args:
        timeout: seconds (or ``timedelta``) for the whole doctor.
        bandwidth: also measure each host's link to the next (64 MiB each).
        skip: check ids not to run (see ``docs/doctor.md``).
        strict: ``False`` treats "not launched" as a world of one process.
        environ: the variables to read; default ``os.environ``.

    Returns:
        The world's :class:`DoctorReport` on every rank once the world formed, else this rank's own.

    Raises:
        ValueError: an unknown id in ``skip``, or a bad ``timeout``.
        TypeError: ``timeout`` is not seconds or a ``timedelta``.
    """
    seconds = to_seconds(timeout, "timeout")
    chosen = _skip_set(skip)
    import torch  # noqa: F401  # imported before the clock starts: seconds on a loaded host, and no check's cost

    started = time.monotonic()
    end = started + seconds
    variables = dict(os.environ if environ is None else environ)
    env, env_check = check_env(strict=strict, environ=variables)
    identity = local_identity(variables)
    local = [env_check, *run_local(env, identity=identity, environ=variables, budget=lambda: end - time.monotonic())]
    local = [Check(id=c.id, status="skip", summary="skipped (--skip)") if c.id in chosen else c for c in local]
    if env is None:
        checks = [*local, *skipped(WORLD_IDS[:-1], "the environment could not be resolved")]
    elif "world" in chosen:
        checks = [*local, *skipped(WORLD_IDS[:-1], "skipped (--skip world)")]
    else:
        checks = _world(env, local=local, environ=variables, end=end, bandwidth=bandwidth, skip=chosen)
    return make_report(
        checks,
        world_size=env.world_size if env else 1,
        rank=env.rank if env else 0,
        elapsed_s=time.monotonic() - started,
    )
