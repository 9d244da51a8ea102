"""``init_with_retry``: a bounded, diagnosing, retrying ``torch.distributed`` rendezvous."""

from __future__ import annotations

import functools
import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import HashStore

from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import DistinitError
from distinit.init import _caller, _preflight, _world
from distinit.init._backend import choose_backend
from distinit.init._backoff import Backoff
from distinit.init._boundary import readable
from distinit.init._bounds import Bounds
from distinit.init._flight import SingleFlight
from distinit.init._handover import OVERRUN_GRACE, check_no_leftover
from distinit.init._report import AttemptRecord, InitReport
from distinit.init._session import Rendezvous

logger = logging.getLogger("distinit.init")

_ONE_AT_A_TIME = SingleFlight("init_with_retry()")


def init_with_retry(
    backend: str | None = None,
    *,
    env: DistEnv | None = None,
    deadline: float | timedelta = 600.0,
    attempt_timeout: float | timedelta = 30.0,
    pg_timeout: float | timedelta | None = None,
    device_id: int | torch.device | None = None,
    backoff: Backoff | None = None,
    verify: bool = True,
) -> InitReport:
    """Initialise the default process group, retrying transient failures within ``deadline``.

    Pre-flight checks run first (local, instant). Rank 0 then hosts one TCPStore (under torchrun every rank
    uses the agent's store); the others probe it, classifying why it cannot be reached. A join protocol on
    the store checks that the ranks agree on the world size and that no rank is claimed twice; only then
    ``init_process_group`` runs. Failed attempts are cleaned up and retried with ``backoff`` pauses;
    misconfiguration is never retried. ``deadline`` bounds rendezvous only; collectives use ``pg_timeout``.
    A compatible group already initialised is returned at once; concurrent calls from several threads run
    one rendezvous and share its outcome; an interrupted call (Ctrl-C) leaves no group and no thread.

    Args:
        backend: ``"gloo"``, ``"nccl"``, ...; None: NCCL if ``device_id`` is given or this rank's
            ``local_rank`` names a GPU, else gloo.
        env: the world; default :func:`distinit.env_from_scheduler()`.
        deadline: seconds or ``timedelta`` for rendezvous, across attempts; ``math.inf``: no limit.
        attempt_timeout: one attempt's bound, clamped to what is left of the deadline.
        pg_timeout: the collective timeout after init (torch's default if None; ``inf`` is clamped to a year).
        device_id: bind the group to this device (eager NCCL communicator creation).
        backoff: pause policy between attempts; default ``Backoff()`` (1 s, x2, cap 30 s, jitter 1 s).
        verify: run one tiny ``all_reduce`` so that success means the fabric works.

    Returns:
        An :class:`InitReport` with one record per attempt.

    Raises:
        DuplicateRankError: two processes claimed the same rank (raised on every joined rank).
        WorldSizeMismatchError: ranks disagree on the world size, or rank >= world size.
        MasterUnreachableError: MASTER_ADDR does not resolve, has no route, or swallows packets.
        PortInUseError: rank 0 cannot bind MASTER_PORT, or a non-TCPStore program listens on it.
        RendezvousTimeoutError: the deadline passed; names the missing ranks and each attempt.
        RendezvousError: another misconfiguration (bad interface name, unavailable backend, a different
            process group already initialised, an abandoned rendezvous of this process still blocked).
        SchedulerEnvError: MASTER_ADDR/MASTER_PORT missing or malformed (from ``env`` resolution too).
        TypeError: a duration is not seconds or a ``timedelta`` (``"600"``, ``True``).
        ValueError: a duration is NaN, zero or negative.
    """
    bounds = Bounds.of(deadline=deadline, attempt_timeout=attempt_timeout, pg_timeout=pg_timeout)
    try:
        world = env if env is not None else env_from_scheduler()
        chosen = choose_backend(
            backend, local_rank=world.local_rank, local_world_size=world.local_world_size, device_id=device_id
        )
        _preflight.check_world(rank=world.rank, world_size=world.world_size)
        call = functools.partial(
            _init, world, chosen, bounds=bounds, device_id=device_id, backoff=backoff or Backoff(), verify=verify
        )
        return _ONE_AT_A_TIME.run(call, rank=world.rank, patience=bounds.deadline + OVERRUN_GRACE)
    except DistinitError as exc:
        raise readable(exc) from None


def _init(
    world: DistEnv,
    backend: str,
    *,
    bounds: Bounds,
    device_id: int | torch.device | None,
    backoff: Backoff,
    verify: bool,
) -> InitReport:
    """The rendezvous itself, run by one thread of the process at a time."""
    # An interrupted call winds down at its next check, within one attempt's bound at worst.
    check_no_leftover(world.rank, patience=min(bounds.deadline, bounds.attempt_timeout + OVERRUN_GRACE))
    if _preflight.check_existing(backend=backend, rank=world.rank, world_size=world.world_size):
        master = f"{world.master_addr}:{world.master_port}" if world.master_addr else None
        return InitReport(
            backend=backend,
            rank=world.rank,
            world_size=world.world_size,
            master=master,
            store="existing",
            elapsed=0.0,
            already_initialized=True,
        )
    _preflight.check_master(
        master_addr=world.master_addr,
        master_port=world.master_port,
        world_size=world.world_size,
        rank=world.rank,
        launcher=world.launcher,
    )
    _preflight.check_backend(backend, rank=world.rank)
    _preflight.check_interfaces(backend, os.environ, rank=world.rank)
    _preflight.check_advertised_address(backend, world, os.environ)
    if world.world_size == 1 and not (world.master_addr and world.master_port):
        return _alone(world, backend, bounds=bounds, device_id=device_id, verify=verify)
    session = Rendezvous(
        env=world,
        backend=backend,
        bounds=bounds,
        device_id=device_id,
        verify=verify,
        environ=os.environ,
        backoff=backoff,
    )
    _caller.run(session)
    report = _report(session)
    _log_done(report)
    return report


def _alone(
    env: DistEnv, backend: str, *, bounds: Bounds, device_id: int | torch.device | None, verify: bool
) -> InitReport:
    """A world of one needs no network: a local store, as composer does."""
    started = time.monotonic()
    verified = _world.settle(env, [_world.claim_of(env, os.environ)]) if verify else None
    dist.init_process_group(
        backend, store=HashStore(), rank=0, world_size=1, timeout=bounds.init_timeout(), device_id=device_id
    )
    return InitReport(
        world=verified,
        backend=backend,
        rank=0,
        world_size=1,
        store="hosted",
        generation=0,
        attempts=(AttemptRecord(number=1, generation=0, phase="done", elapsed=0.0, started_at=0.0),),
        elapsed=round(time.monotonic() - started, 4),
    )


def _report(session: Rendezvous) -> InitReport:
    """The :class:`InitReport` of the group ``session`` formed."""
    return InitReport.model_validate(
        {
            "backend": session.backend,
            "rank": session.rank,
            "world_size": session.world_size,
            "master": session.master.name,
            "store": "agent" if session.agent else "hosted" if session.hosting else "client",
            "generation": session.generation,
            "attempts": tuple(session.log.records),
            "elapsed": round(time.monotonic() - session.start, 4),
            "group_counter_reset": session.former.counter_resets,
            "world": session.former.world,
        }
    )


def _log_done(report: InitReport) -> None:
    logger.info(
        "rank %d: %s process group formed at %s in %.2f s after %d attempt(s)",
        report.rank,
        report.backend,
        report.master,
        report.elapsed,
        len(report.attempts),
        extra={
            "distinit": {
                "event": "init.done",
                "rank": report.rank,
                "world_size": report.world_size,
                "elapsed_s": report.elapsed,
                "attempts": len(report.attempts),
                "generation": report.generation,
            }
        },
    )
