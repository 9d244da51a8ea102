"""The work of the public calls of ``_api.py``: the normalised call, the rendezvous, the watch, the boundary.

One normalised call, the rendezvous both calls share, the watch ``setup()`` keeps until ``teardown()``, and
the boundary's readable error.

Imported by the first call, not by ``from distinit import setup`` (issue 35): this module builds
:class:`SetupResult` and imports what the calls need (torch.distributed, pydantic's models of ``env`` and
``_report``, the rendezvous machinery), which a script pays once it starts the world, not at its imports.

The boundary: inside, errors are raised ``from`` what caused them (an internal attempt failure, a torch or
OS error), and they cross a thread and the attempt loop, so their tracebacks hold dozens of frames nobody
needs. At the public functions the error is raised again without its traceback and ``from None``
(:func:`readable`); the foreign cause stays available as ``exc.cause`` and the whole chain is logged at DEBUG.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch.distributed import HashStore

from distinit._foreign import first_line
from distinit._identity import claim_of
from distinit._torch import collective_counts, default_store, group_name
from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import DistinitError
from distinit.hang import HangSettings
from distinit.init import _loopback
from distinit.init._attempt import Rendezvous
from distinit.init._device import choose_backend, device_plan
from distinit.init._form import settle
from distinit.init._liveness import Liveness, consequence, peer_closed
from distinit.init._policy import AttemptFailed, Backoff, Bounds
from distinit.init._report import AttemptRecord, InitReport
from distinit.init._thread import OVERRUN_GRACE, PROCESS, check_no_leftover

logger = logging.getLogger("distinit.init")

#: Longest time teardown() spends naming a peer that went away (two beats and the store's round trips).
LOST_BOUND = 5.0


@dataclass(frozen=True)
class Arguments:
    """One public call's arguments, normalised once on entry (the bounds validated before any effect)."""

    bounds: Bounds
    backoff: Backoff
    verify: bool

    @classmethod
    def of(
        cls, *, deadline: object, attempt_timeout: object, pg_timeout: object, backoff: Backoff | None, verify: bool
    ) -> Arguments:
        """Validate and normalise (see :meth:`Bounds.of` for what it raises)."""
        bounds = Bounds.of(deadline=deadline, attempt_timeout=attempt_timeout, pg_timeout=pg_timeout)
        return cls(bounds=bounds, backoff=backoff or Backoff(), verify=verify)

    @property
    def patience(self) -> float:
        """How long a concurrent caller waits for the call in flight."""
        return self.bounds.deadline + OVERRUN_GRACE


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


def run_init_with_retry(
    backend: str | None, *, env: DistEnv | None, device_id: int | torch.device | None, call: Arguments
) -> InitReport:
    """:func:`distinit.init_with_retry` once its arguments are normalised: resolve, choose, rendezvous."""
    world = env if env is not None else env_from_scheduler()
    chosen = choose_backend(
        backend, local_rank=world.local_rank, local_world_size=world.local_world_size, device_id=device_id
    )
    _loopback.check_world(rank=world.rank, world_size=world.world_size)
    with PROCESS.flight.lead(what="init_with_retry()", rank=world.rank, patience=call.patience):
        return _rendezvous(world, chosen, device_id=device_id, call=call)


def run_setup(
    backend: str | None,
    *,
    environ: Mapping[str, str] | None,
    strict: bool,
    call: Arguments,
    hang: HangSettings,
    at_exit: Callable[[], None],
) -> SetupResult:
    """:func:`distinit.setup` once its arguments are normalised, under the process's single-flight guard.

    ``at_exit`` is registered with ``atexit`` once per process: the public ``teardown``, so that
    ``atexit.unregister(distinit.teardown)`` finds it.
    """
    with PROCESS.flight.lead(what="setup()", rank=None, patience=call.patience):
        return _set_up(backend, environ=environ, strict=strict, call=call, hang=hang, at_exit=at_exit)


def _set_up(
    backend: str | None,
    *,
    environ: Mapping[str, str] | None,
    strict: bool,
    call: Arguments,
    hang: HangSettings,
    at_exit: Callable[[], None],
) -> SetupResult:
    """setup() itself, run by one thread of the process at a time."""
    current = PROCESS.setup
    if isinstance(current, SetupResult) and dist.is_initialized():
        return current
    env = env_from_scheduler(environ, strict=strict, export=True)
    plan = device_plan(backend, local_rank=env.local_rank, local_world_size=env.local_world_size)
    device_id: torch.device | None = None
    device = "cpu"
    if plan.backend == "nccl" and plan.device is not None:
        torch.cuda.set_device(plan.device)
        device_id = torch.device("cuda", plan.device)
        device = f"cuda:{plan.device}"
    _loopback.check_world(rank=env.rank, world_size=env.world_size)
    report = _rendezvous(env, plan.backend, device_id=device_id, call=call)
    if report.world is not None and report.world != env:
        # What the world verified (node rank, local world size, node count) replaces the environment's
        # unknowns in os.environ too, so Lightning and accelerate read the truth.
        env = report.world
        env.export()
    result = SetupResult(env=env, report=report, device=device)
    PROCESS.setup = result
    if PROCESS.liveness is not None:  # a group destroyed without teardown(): its watch ends now
        PROCESS.liveness.stop()
    PROCESS.liveness = _watch(env, hang)
    if not PROCESS.atexit_registered:
        atexit.register(at_exit)
        PROCESS.atexit_registered = True
    return result


def _rendezvous(world: DistEnv, backend: str, *, device_id: int | torch.device | None, call: Arguments) -> InitReport:
    """The rendezvous itself (both public calls), run by one thread of the process at a time."""
    bounds = call.bounds
    # An interrupted call winds down at its next check, within one attempt's bound at worst.
    check_no_leftover(world.rank, patience=min(bounds.deadline, bounds.attempt_timeout + OVERRUN_GRACE))
    if _loopback.check_existing(backend=backend, rank=world.rank, world_size=world.world_size):
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
    trap = _loopback.preflight(backend, world, os.environ)
    if world.world_size == 1 and not (world.master_addr and world.master_port):
        return _alone(world, backend, bounds=bounds, device_id=device_id, verify=call.verify)
    return Rendezvous(
        env=world,
        backend=backend,
        bounds=bounds,
        device_id=device_id,
        verify=call.verify,
        environ=os.environ,
        backoff=call.backoff,
        call=PROCESS.take_call(),
        watch_init=trap is not None,
    ).run()


def _alone(
    env: DistEnv, backend: str, *, bounds: Bounds, device_id: int | torch.device | None, verify: bool
) -> InitReport:
    """A world of one needs no network: a local store, as composer does."""
    started = time.monotonic()
    verified = settle(env, [claim_of(env, os.environ)]) if verify else None
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


def _watch(env: DistEnv, hang: HangSettings | None = None) -> Liveness | None:
    """Keep the ranks' liveness after setup() (see :class:`~._liveness.Liveness`) on the group's store."""
    world_size = env.world_size
    store = default_store() if world_size >= 2 else None
    if store is None:
        return None
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return Liveness.started(
        dist.PrefixStore("distinit", store),
        rank=dist.get_rank(),
        world_size=world_size,
        environ=os.environ,
        master=(addr, int(port)) if addr and port.isascii() and port.isdigit() else None,
        torchrun=env.launcher == "torchrun",
        hang=hang,
        counts=collective_counts,
        group_name=group_name,
    )


def _bounded_lost(liveness: Liveness) -> str:
    """:meth:`Liveness.lost` in a thread, bounded: a store call that never returns cannot hold the exit."""
    found: list[str] = []
    thread = threading.Thread(target=lambda: found.append(liveness.lost(LOST_BOUND)), name="distinit-lost", daemon=True)
    thread.start()
    thread.join(LOST_BOUND + 1.0)
    if found:
        return found[0]
    return f"unknown: the store did not answer within {LOST_BOUND:.0f} s (its host, rank 0, may be frozen)"


def _name_the_lost(liveness: Liveness) -> bool:
    """The process ends on an uncaught exception: record why, and name who stopped first when it was a peer.

    A collective that failed on a peer (or timed out waiting for one) is a consequence: this rank records so
    (others never name it), then says which rank stopped first. Any other exception is this rank's own
    failure: recorded with its type and first line, so the others can name it. Rank 0 then stays up until
    the ranks still running read the finding from the store it hosts (bounded). So does a rank 0 that ends
    normally holding a finding: it caught the error (Lightning's settings exchange, a user's ``except``).

    Returns whether rank 0 should see the others off (:meth:`Liveness.stop`): not after a Ctrl-C.
    """
    failed = getattr(sys, "last_value", None)
    if isinstance(failed, KeyboardInterrupt):
        return False
    if failed is None:
        if liveness.rank == 0 and liveness.finding is not None:
            liveness.linger(LOST_BOUND)  # the others may not have read the finding it holds yet
        return True
    if consequence(failed):
        liveness.record_exit("peer", first_line(failed))
        logger.warning(
            "rank %d: the collective failed because a peer went away: %s",
            liveness.rank,
            _bounded_lost(liveness),
            extra={"distinit": {"event": "init.peer_closed", "rank": liveness.rank}},
        )
    else:
        liveness.record_exit("error", f"{type(failed).__name__}: {first_line(failed)}")
        if liveness.rank != 0:
            return True
        logger.warning(
            "rank 0: leaving on its own error; the store it hosts stays up until the others know why: %s",
            _bounded_lost(liveness),
            extra={"distinit": {"event": "init.own_failure", "rank": 0}},
        )
    if liveness.rank == 0:
        liveness.linger(LOST_BOUND)  # the others read the finding from the store rank 0 hosts
    return True


def lost_peer(exc: BaseException) -> str | None:
    """Who stopped first, when ``exc`` is a collective that failed because a peer went away (bounded).

    The words name the rank, or say "unknown" with the facts. None when ``exc`` is another failure or
    :func:`setup` does not watch the ranks (it did not form the group). This rank is recorded as a
    consequence first, so no other rank names it.
    """
    liveness = PROCESS.liveness
    if not isinstance(liveness, Liveness) or not peer_closed(exc):
        return None
    liveness.record_exit("peer", first_line(exc))
    return liveness.lost(LOST_BOUND)


def run_teardown() -> None:
    """:func:`distinit.teardown`: forget the setup, name a peer that went away, destroy the default group."""
    PROCESS.setup = None
    liveness, PROCESS.liveness = PROCESS.liveness, None
    if liveness is not None:
        see_off = _name_the_lost(liveness)
        liveness.stop(see_off=liveness.hold(LOST_BOUND) if see_off else 0.0)
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


def readable(exc: DistinitError) -> DistinitError:
    """``exc`` ready to be raised ``from None`` at a public function (see the module docstring)."""
    if exc.cause is None:
        exc.cause = foreign_cause(exc)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("the error below in full, with what caused it", exc_info=exc)
    return exc.with_traceback(None)


def foreign_cause(exc: BaseException) -> BaseException | None:
    """The first exception in ``exc``'s chain that is neither a distinit error nor an attempt failure."""
    seen: set[int] = set()
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not isinstance(current, (DistinitError, AttemptFailed)):
            return current
        current = current.__cause__ or current.__context__
    return None
