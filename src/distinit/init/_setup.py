"""``setup()``/``teardown()``: the one call at the top of ``main()`` and its undo."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field

from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import DistinitError
from distinit.init._api import init_with_retry
from distinit.init._backend import device_plan
from distinit.init._backoff import Backoff
from distinit.init._boundary import readable
from distinit.init._bounds import Bounds
from distinit.init._flight import SingleFlight
from distinit.init._handover import OVERRUN_GRACE
from distinit.init._heartbeat import Liveness, peer_closed
from distinit.init._pace import Pace, loss_bound
from distinit.init._report import InitReport

logger = logging.getLogger("distinit.init")

_ONE_AT_A_TIME = SingleFlight("setup()")
#: Longest time teardown() spends naming a peer that went away (two beats and the store's round trips).
LOST_BOUND = 5.0


class SetupResult(BaseModel):
    """What :func:`setup` did: the resolved world, how the group formed, and the device bound."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: DistEnv = Field(
        description="The world, resolved from the launcher, verified by the ranks' host identities once the group "
        "formed (unknown node rank, local world size and node count filled in), and exported to os.environ."
    )
    report: InitReport = Field(description="How the process group formed.")
    device: str = Field(description='The device this rank computes on: "cuda:N" or "cpu".')


# Their public home, set once built (pydantic resolves the annotations in the defining module): reprs and
# pickles never name a private module.
SetupResult.__module__ = "distinit.init"


class _Current:
    """The process-wide result of :func:`setup` (set by ``setup()``, undone by ``teardown()``)."""

    result: SetupResult | None = None
    liveness: Liveness | None = None
    atexit_registered: bool = False


def setup(
    backend: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    deadline: float | timedelta = 600.0,
    attempt_timeout: float | timedelta = 30.0,
    pg_timeout: float | timedelta | None = None,
    backoff: Backoff | None = None,
    verify: bool = True,
    strict: bool = True,
) -> SetupResult:
    """Resolve the world, bind the GPU, form the process group, and destroy it at exit. Idempotent.

    The one call at the top of ``main()`` under torchrun, srun, mpirun or a plain ``env://`` launch:
    ``env_from_scheduler(export=True)``, then ``torch.cuda.set_device`` when CUDA is used (``local_rank``, or
    ``local_rank % visible`` where the launcher gives each rank GPUs of its own: ``srun --gpus-per-task``),
    then :func:`init_with_retry` (with ``device_id`` for NCCL, so the communicator is created eagerly and
    success means NCCL works), and :func:`teardown` registered with ``atexit``. A second call returns the
    first call's result while the group is alive.

    Args:
        backend: as :func:`init_with_retry` (None: NCCL if this rank sees a GPU, else gloo).
        environ: variables to resolve the world from; default ``os.environ``.
        deadline: total seconds (or ``timedelta``) for rendezvous; ``math.inf``: no limit.
        attempt_timeout: one attempt's bound.
        pg_timeout: collective timeout after init (torch default if None).
        backoff: pause policy between attempts.
        verify: run one tiny collective after init.
        strict: passed to :func:`distinit.env_from_scheduler`.

    Returns:
        A :class:`SetupResult` with the ``DistEnv``, the ``InitReport`` and the device.

    Concurrent calls from several threads run one setup and all return its result (or its error).

    Raises:
        SchedulerEnvError: the launcher variables are missing or contradictory.
        RendezvousError: any error of :func:`init_with_retry`.
        TypeError: a duration is not seconds or a ``timedelta``; nothing was exported or bound.
        ValueError: a duration is NaN, zero or negative; nothing was exported or bound.
    """
    # Validated before any effect (export, device binding): a bad duration changes nothing.
    bounds = Bounds.of(deadline=deadline, attempt_timeout=attempt_timeout, pg_timeout=pg_timeout)
    init = functools.partial(
        init_with_retry,
        deadline=deadline,
        attempt_timeout=attempt_timeout,
        pg_timeout=pg_timeout,
        backoff=backoff,
        verify=verify,
    )
    call = functools.partial(_setup, backend, environ=environ, strict=strict, init=init)
    try:
        return _ONE_AT_A_TIME.run(call, rank=None, patience=bounds.deadline + OVERRUN_GRACE)
    except DistinitError as exc:
        raise readable(exc) from None


def _setup(
    backend: str | None, *, environ: Mapping[str, str] | None, strict: bool, init: Callable[..., InitReport]
) -> SetupResult:
    """setup() itself, run by one thread of the process at a time."""
    current = _Current.result
    if current is not None and dist.is_initialized():
        return current
    env = env_from_scheduler(environ, strict=strict, export=True)
    plan = device_plan(backend, local_rank=env.local_rank, local_world_size=env.local_world_size)
    device_id: torch.device | None = None
    device = "cpu"
    if plan.backend == "nccl" and plan.device is not None:
        torch.cuda.set_device(plan.device)
        device_id = torch.device("cuda", plan.device)
        device = f"cuda:{plan.device}"
    report = init(plan.backend, env=env, device_id=device_id)
    if report.world is not None and report.world != env:
        # What the world verified (node rank, local world size, node count) replaces the environment's
        # unknowns in os.environ too, so Lightning and accelerate read the truth.
        env = report.world
        env.export()
    result = SetupResult(env=env, report=report, device=device)
    _Current.result = result
    if _Current.liveness is not None:  # a group destroyed without teardown(): its watch ends now
        _Current.liveness.stop()
    _Current.liveness = _watch(env.world_size)
    if not _Current.atexit_registered:
        atexit.register(teardown)
        _Current.atexit_registered = True
    return result


def _watch(world_size: int) -> Liveness | None:
    """Keep the ranks' liveness after setup() (see :class:`~._heartbeat.Liveness`) on the group's store."""
    default_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    if world_size < 2 or default_store is None or not dist.is_initialized():
        return None
    pace = Pace.for_world(world_size, loss_bound=loss_bound(os.environ))
    liveness = Liveness(
        dist.PrefixStore("distinit", default_store()),
        rank=dist.get_rank(),
        world_size=world_size,
        beat=pace.beat,
        stale=pace.stale,
    )
    liveness.start()
    return liveness


def _name_the_lost(liveness: Liveness) -> None:
    """The process ends on an uncaught collective error from a peer that went away: name the peer (bounded)."""
    failed = getattr(sys, "last_value", None)
    if not peer_closed(failed):
        return
    found: list[str | None] = []
    thread = threading.Thread(target=lambda: found.append(liveness.lost(LOST_BOUND)), name="distinit-lost", daemon=True)
    thread.start()
    thread.join(LOST_BOUND + 1.0)
    logger.warning(
        "rank %d: the collective failed because a peer went away: %s",
        liveness.rank,
        found[0] if found and found[0] else f"no rank could be named within {LOST_BOUND:.0f} s",
        extra={"distinit": {"event": "init.peer_closed", "rank": liveness.rank}},
    )
    if liveness.rank == 0:
        liveness.linger(LOST_BOUND)  # the others read the finding from the store rank 0 hosts


def teardown() -> None:
    """Destroy the default process group if one exists and forget :func:`setup`'s result. Idempotent.

    At interpreter exit after an uncaught collective error from a peer that went away (gloo's "Connection
    closed by peer", NCCL's remote errors), it first logs a WARNING naming the rank, host and pid that went
    away and when it last beat (:class:`~._heartbeat.Liveness`).
    """
    _Current.result = None
    liveness, _Current.liveness = _Current.liveness, None
    if liveness is not None:
        _name_the_lost(liveness)
        liveness.stop()
    if dist.is_available() and dist.is_initialized():
        # Free cyclic garbage that still holds the group (a DDP reducer, say) while the interpreter is
        # fully alive: left to interpreter shutdown, its native threads may be torn down out of order.
        gc.collect()
        try:
            dist.destroy_process_group()
        except (RuntimeError, AssertionError, ValueError) as exc:
            logger.warning(
                "destroy_process_group failed at teardown: %s",
                exc,
                extra={"distinit": {"event": "init.teardown_failed", "error": type(exc).__name__}},
            )
