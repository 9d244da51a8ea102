"""Forming the group once every rank joined: ``init_process_group``, the check collective, and the undo.

torch's backend bootstrap waits on peers' keys with the *group* timeout, not the store's, so the group is
created with the attempt's bound and the collective timeout is set right after (a private torch API,
feature-detected). A failed init is undone completely, including torch's leaked group counter
(pytorch/pytorch#46561), so that the next attempt in this process can meet fresh peers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from distinit._duration import to_timedelta
from distinit.env import DistEnv
from distinit.errors import RendezvousError, SchedulerEnvError
from distinit.init._attempt import AttemptFailed, quote
from distinit.init._backend import device_uuid
from distinit.init._bounds import Bounds
from distinit.init._init_verdict import classify_init_failure
from distinit.init._join import JoinProtocol
from distinit.init._world import claim_of, exchange, settle

logger = logging.getLogger("distinit.init")


def init_group(
    backend: str,
    *,
    store: dist.Store,
    rank: int,
    world_size: int,
    bound: timedelta,
    init_timeout: timedelta | None,
    device_id: int | torch.device | None,
) -> None:
    """``init_process_group`` with its bootstrap bounded by ``bound``.

    Without torch's private ``_set_pg_timeout`` the group is created with ``init_timeout`` instead
    (torch's behaviour: the collective timeout also bounds the bootstrap).
    """
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=bound if _set_pg_timeout() is not None else init_timeout,
        device_id=device_id,
    )


def set_collective_timeout(timeout: timedelta) -> None:
    """Give the formed default group its collective timeout (no-op without the private API)."""
    setter = _set_pg_timeout()
    if setter is not None:
        setter(timeout)


def _set_pg_timeout() -> Callable[[timedelta], None] | None:
    setter: Callable[[timedelta], None] | None = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    return setter


def destroy_group(rank: int) -> bool:
    """Destroy the default group if one exists, then reset torch's leaked counter; True if it was reset."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except (RuntimeError, AssertionError, ValueError) as exc:
            logger.debug("rank %d: destroy_process_group after a failed init: %s", rank, exc)
    return reset_group_counter()


def reset_group_counter() -> bool:
    """Undo torch's leaked group counter after a failed init (pytorch/pytorch#46561).

    ``init_process_group`` bumps the private ``_world.group_count`` before anything can fail and never
    rolls it back, so a retry in the same process uses ``default_pg/1`` keys while fresh peers use
    ``default_pg/0``: they never meet. Feature-detected: returns False when the attribute is absent or
    when process groups still exist (then the counter is in use and must not be touched).
    """
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is None or not isinstance(getattr(world, "group_count", None), int):
        return False
    if getattr(world, "pg_map", None) or world.group_count == 0:
        return False
    world.group_count = 0
    return True


class GroupFormer:
    """Form the default group on a joined generation, verify it, and undo a failed one completely."""

    def __init__(
        self,
        *,
        backend: str,
        env: DistEnv,
        environ: Mapping[str, str],
        bounds: Bounds,
        device_id: int | torch.device | None,
        verify: bool,
    ) -> None:
        self.backend, self.env, self.environ = backend, env, environ
        self.bounds, self.device_id, self.verify = bounds, device_id, verify
        #: The world as the ranks' host identities verified it (set by a verified ``form``).
        self.world: DistEnv | None = None
        #: How often torch's leaked group counter was reset (reported as ``group_counter_reset``).
        self.counter_resets = 0

    def form(self, join: JoinProtocol, generation: int, *, end: float, verifying: Callable[[], None]) -> None:
        """Form the group on ``generation``'s keys within ``end`` (monotonic); ``verifying()`` marks the check.

        Raises:
            RendezvousError: ``init_process_group`` rejected its arguments (never retried).
            AttemptFailed: (kind ``init``) it failed; the generation was bumped so every rank starts anew.
        """
        store = join.store
        bound = to_timedelta(max(end - time.monotonic(), 1.0))
        store.set_timeout(bound)
        collective = self.bounds.collective_timeout(self.backend)
        try:
            init_group(
                self.backend,
                store=dist.PrefixStore(join.prefix(generation), store),
                rank=self.env.rank,
                world_size=self.env.world_size,
                bound=bound,
                init_timeout=self.bounds.init_timeout(),
                device_id=self.device_id,
            )
            if self.verify:
                verifying()
                self.world = self._verified(end)
            set_collective_timeout(collective)
        except (SchedulerEnvError, RendezvousError):
            self.undo()  # the world disagrees with the environment: a verdict, the same on every rank
            raise
        except (ValueError, TypeError) as exc:
            self.undo()
            raise RendezvousError(
                f"rank {self.env.rank}: init_process_group rejected its arguments: {exc}",
                rank=self.env.rank,
                why="an argument (backend, device_id, pg_timeout) does not fit this torch build or host.",
                fix="check the arguments passed to init_with_retry()/setup().",
                master=join.master,
                generation=generation,
            ) from exc
        except (dist.DistError, RuntimeError, OSError) as exc:
            self.undo()
            verdict = classify_init_failure(exc, join=join, generation=generation, env=self.env, hosting=join.hosting)
            if verdict is not None:  # not transient (gloo's loopback trap): one verdict everywhere, no new generation
                raise verdict from exc
            # If the store is gone too, the next attempt reconnects and reads the generation anew.
            with contextlib.suppress(dist.DistError, RuntimeError):
                join.abandon(generation)
            raise AttemptFailed(
                "init",
                f"init_process_group failed in generation {generation} after every rank joined: {quote(exc)}",
            ) from exc
        finally:
            store.set_timeout(collective)

    def _verified(self, end: float) -> DistEnv:
        """Exchange host identities (the check collective) and settle the world they describe."""
        gpu = None
        if self.backend == "nccl" and self.device_id is not None:
            index = self.device_id if isinstance(self.device_id, int) else self.device_id.index
            gpu = device_uuid(torch.cuda.current_device() if index is None else index)
        claims = exchange(
            claim_of(self.env, self.environ, gpu=gpu),
            backend=self.backend,
            device_id=self.device_id,
            world_size=self.env.world_size,
            end=end,
        )
        return settle(self.env, claims)

    def undo(self) -> None:
        """Destroy the group this call formed (if any) and reset torch's leaked counter."""
        if destroy_group(self.env.rank):
            self.counter_resets += 1
