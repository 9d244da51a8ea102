"""The public calls: ``setup()``, ``init_with_retry()``, ``teardown()``: their signatures, their words, the boundary.

``from distinit import setup`` imports this module and nothing heavy (issue 35: <= 80 ms over ``import
torch``): the work, its pydantic models (``SetupResult``, ``InitReport``, ``DistEnv``) and the rendezvous
machinery live in ``_setup`` and what it imports, which the first call imports. Type checkers see the real
types through ``TYPE_CHECKING``; the annotations stay strings (``from __future__ import annotations``), so
``help()`` and ``inspect.signature`` show them as written.

Both public calls normalise their arguments once (``Bounds``, the backend, the pause policy) and run the
same rendezvous under the process's one single-flight guard; ``setup()`` also resolves and exports the world,
binds the GPU and keeps watching the ranks' liveness until ``teardown()``. At these functions a distinit
error is raised again without its traceback and ``from None`` (``_setup.readable``): its foreign cause stays
available as ``exc.cause`` and the whole chain is logged at DEBUG.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from distinit.errors import DistinitError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import timedelta

    import torch

    from distinit.env import DistEnv
    from distinit.hang import OnHang
    from distinit.init._policy import Backoff
    from distinit.init._report import InitReport
    from distinit.init._setup import SetupResult


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
    from distinit.init._setup import Arguments, readable, run_init_with_retry  # the work: on the first call

    call = Arguments.of(
        deadline=deadline, attempt_timeout=attempt_timeout, pg_timeout=pg_timeout, backoff=backoff, verify=verify
    )
    try:
        return run_init_with_retry(backend, env=env, device_id=device_id, call=call)
    except DistinitError as exc:
        raise readable(exc) from None


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
    hang_after: float | timedelta | None = None,
    on_hang: OnHang = "report",
    hang_verdict: bool = True,
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
        hang_after: seconds ranks may wait in one collective before the live hang verdict names who they wait
            for (docs/hangs.md); None: ``DISTINIT_HANG_AFTER``, else 10 s or twice the median time between
            collectives once known.
        on_hang: ``"report"`` (log the verdict on every rank and keep waiting) or ``"abort"`` (also stop every
            rank with exit code 75, the culprit first).
        hang_verdict: False turns the hang verdict off (as ``DISTINIT_HANG_AFTER=off`` does).

    Returns:
        A :class:`SetupResult` with the ``DistEnv``, the ``InitReport`` and the device.

    Concurrent calls from several threads run one setup and all return its result (or its error).

    Raises:
        SchedulerEnvError: the launcher variables are missing or contradictory.
        RendezvousError: any error of :func:`init_with_retry`.
        TypeError: a duration is not seconds or a ``timedelta``; nothing was exported or bound.
        ValueError: a duration is NaN, zero or negative; nothing was exported or bound.
    """
    from distinit.hang import HangSettings
    from distinit.init._setup import Arguments, readable, run_setup  # the work: on the first call

    # Validated before any effect (export, device binding): a bad duration changes nothing.
    call = Arguments.of(
        deadline=deadline, attempt_timeout=attempt_timeout, pg_timeout=pg_timeout, backoff=backoff, verify=verify
    )
    hang = HangSettings.of(
        hang_after=hang_after,
        on_hang=on_hang,
        hang_verdict=hang_verdict,
        environ=os.environ if environ is None else environ,
    )
    try:
        return run_setup(backend, environ=environ, strict=strict, call=call, hang=hang, at_exit=teardown)
    except DistinitError as exc:
        raise readable(exc) from None


def teardown() -> None:
    """Destroy the default process group if one exists and forget :func:`setup`'s result. Idempotent.

    At interpreter exit after an uncaught collective error from a peer that went away (gloo's "Connection
    closed by peer", NCCL's remote errors), it first logs a WARNING naming the rank, host and pid that went
    away and when it last beat (:class:`~._liveness.Liveness`).
    """
    from distinit.init._setup import run_teardown

    run_teardown()
