"""The attempt state machine of one ``init_with_retry`` call: reach the store, join, form the group, retry.

One attempt: reach the store (rank 0 hosts it; the others probe and connect), run the join protocol in
this call's namespace and the store's current generation, then form the group on that generation's
``PrefixStore``. A failure that waiting may cure is an :class:`AttemptFailed` and is retried with back-off
until the deadline; a misconfiguration verdict is raised at once. The attempts run in a thread that the
caller may abandon (:mod:`distinit.init._handover`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from collections.abc import Mapping
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed import Store, TCPStore

from distinit._duration import to_timedelta
from distinit.env import DistEnv
from distinit.errors import RankLostError, RendezvousError, RendezvousTimeoutError
from distinit.init import _messages, _reach
from distinit.init._attempt import AttemptFailed, quote
from distinit.init._backoff import Backoff
from distinit.init._bounds import Bounds
from distinit.init._diagnose import SPECIFIC, Master, specific_error
from distinit.init._form import GroupFormer
from distinit.init._grace import Grace
from distinit.init._handover import Abandoned, Handover
from distinit.init._host_lost import host_gone
from distinit.init._init_verdict import InitWatch
from distinit.init._join import JoinProtocol, wait_for_key
from distinit.init._launched import launched
from distinit.init._pace import loss_bound
from distinit.init._records import AttemptLog
from distinit.init._report import Phase
from distinit.init._retry import retry_until

logger = logging.getLogger("distinit.init")


class Calls:
    """Numbers this process's rendezvous calls: the k-th call of each rank meets the k-th call of the others.

    Each call gets a fresh store namespace (setup/teardown/setup meet even if an old store outlived
    teardown). An interrupted call gives its number back: for the peers it never happened.
    """

    count = 0
    resume = False

    @classmethod
    def take(cls) -> tuple[int, bool]:
        """This call's number, and whether it resumes the namespace of an interrupted call."""
        if cls.resume:
            cls.resume = False
            return cls.count, True
        cls.count += 1
        return cls.count, False


class Rendezvous:
    """The state of one ``init_with_retry`` call: store, join protocol, attempt records."""

    def __init__(
        self,
        *,
        env: DistEnv,
        backend: str,
        bounds: Bounds,
        device_id: int | torch.device | None,
        verify: bool,
        environ: Mapping[str, str],
        backoff: Backoff,
    ) -> None:
        self.start = time.monotonic()
        self.bounds, self.backend, self.backoff = bounds, backend, backoff
        self.deadline_at = self.start + bounds.deadline
        self.rank, self.world_size = env.rank, env.world_size
        self.master = Master(addr=env.master_addr or "127.0.0.1", port=env.master_port or 0, rank=env.rank)
        self.agent = env.launcher == "torchrun" and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self.hosting = self.rank == 0 and not self.agent
        job = env.job_id or environ.get("TORCHELASTIC_RUN_ID") or "job"
        self.launched = launched(environ)
        self.loss_bound = loss_bound(environ)
        number, self.resumed = Calls.take()
        self.namespace = f"distinit/{job}/{env.restart_count}/c{number}/"
        self.rng = random.Random()
        self.grace = Grace(foreign=bounds.attempt_timeout)
        self.handover = Handover()
        self.former = GroupFormer(
            backend=backend, env=env, environ=environ, bounds=bounds, device_id=device_id, verify=verify
        )
        self.watch = InitWatch(self.master, env=env, backend=backend, environ=environ, hosting=self.hosting)
        self.log = AttemptLog(rank=self.rank, master=self.master.name, start=self.start, deadline_at=self.deadline_at)
        self.store: TCPStore | None = None
        self.join: JoinProtocol | None = None
        self.counted: JoinProtocol | None = None
        self.generation: int | None = None
        self._phase: Phase = "store"
        self._attempt = (0, self.start)  # (number, monotonic start) of the attempt in progress
        self._paused_at: float | None = None  # set while pausing between attempts

    # one attempt ----------------------------------------------------------------------------------
    def attempt(self, number: int) -> None:
        """Run attempt ``number``; raise :class:`AttemptFailed` (retried) or a verdict (not retried)."""
        self.handover.check()
        begun = time.monotonic()
        self._attempt, self._paused_at = (number, begun), None
        end = min(begun + self.bounds.attempt_timeout, self.deadline_at)
        self._phase = "store" if self.hosting else "probe"
        try:
            try:
                join, generation = self._join(end)
                self.handover.check()  # the caller gave up while the last rank joined: never form the group
                # Every rank joined: init gets a bound of its own. Ranks that waited long for a late peer
                # would otherwise start init with scraps of their attempt while the late rank has all of
                # its own, give up first, and fall a generation out of phase with it.
                self._phase = "init"
                with self.watch.during(join.namespace, generation):  # a peer's verdict ends a blocked init
                    self.former.form(
                        join,
                        generation,
                        end=min(time.monotonic() + self.bounds.attempt_timeout, self.deadline_at),
                        verifying=self._verifying,
                    )
            except (dist.DistError, RuntimeError, OSError) as exc:
                gone = self._host_gone()
                if gone is not None:
                    raise gone from exc
                raise self._lost(exc) from exc
        except (AttemptFailed, RendezvousError) as exc:
            self.log.record(number=number, begun=begun, phase=self._phase, generation=self.generation, exc=exc)
            if isinstance(exc, AttemptFailed):
                _reach.escalate(self.grace, exc, since=time.monotonic(), master=self.master)
            raise
        if not self.handover.claim():
            self.former.undo()  # the caller already gave up: never leave a group behind it
            raise Abandoned
        self._phase = "done"
        self.log.record(number=number, begun=begun, phase="done", generation=self.generation, exc=None)

    def _join(self, end: float) -> tuple[JoinProtocol, int]:
        """Reach the store if needed and run the join protocol; the generation every rank joined."""
        if self.join is None:
            self._open_store(end)
        join, store = self.join, self.store
        if join is None or store is None:  # pragma: no cover - _open_store sets both or raises
            raise AttemptFailed("store", "no store")
        # A failed init restored the collective timeout on the store: bound this attempt's calls again.
        store.set_timeout(to_timedelta(max(end - time.monotonic(), 1.0)))
        self._phase = "join"
        self.generation = generation = join.generation()
        join.enter(generation)
        join.wait(generation, end - time.monotonic(), sleep=self.handover.sleep)
        return join, generation

    def _verifying(self) -> None:
        self._phase = "verify"

    def _open_store(self, end: float) -> None:
        if self.hosting:
            store = _reach.host(self.master, end=end, on_busy=self._publish_duplicate_master)
        else:
            store = _reach.connect(self.master, end=end, grace=self.grace, rng=self.rng, sleep=self.handover.sleep)
        self.store, self.join = store, self._protocol(store)
        self.counted = self.join  # what the join counted stays readable after the store is dropped

    def _publish_duplicate_master(self, end: float) -> None:
        _reach.publish_duplicate_master(self.master.port, end=end, protocol=lambda s: self._protocol(s, hosting=False))

    def _protocol(self, store: Store, *, hosting: bool | None = None) -> JoinProtocol:
        return JoinProtocol(
            store,
            namespace=self.namespace,
            rank=self.rank,
            world_size=self.world_size,
            master=self.master.name,
            hosting=self.hosting if hosting is None else hosting,
            deadline=self.bounds.deadline,
            resumed=self.resumed,
            launched=self.launched,
            loss_bound=self.loss_bound,
        )

    def _host_gone(self) -> RankLostError | None:
        """This rank joined and the store failed: is its host, rank 0, gone? (see :mod:`._host_lost`)."""
        join, generation = self.join, self.generation
        if self.hosting or self.agent or join is None or generation is None:
            return None
        claimant = join.host_claimant
        if not join.beating or claimant is None:
            return None  # not waiting in an incomplete join with rank 0 in it: the attempts handle it
        frozen = join.frozen_for()
        join.stop_beating()
        if frozen is not None:
            # This process did not run for longer than the loss bound: rank 0 declared it lost, published
            # that verdict and left. The verdict is about this rank, never rank 0.
            return _messages.frozen_self(
                rank=self.rank,
                claimant=join.me.describe(join.me.encode()),
                frozen_for=frozen,
                stale=join.pace.stale,
                master=self.master.name,
                generation=generation,
            )
        return host_gone(
            self.master, claimant=claimant, generation=generation, end=self.deadline_at, sleep=self.handover.sleep
        )

    def _lost(self, exc: BaseException) -> AttemptFailed:
        """A torch/socket error outside the phases that translate their own: the store failed."""
        if not self.hosting:
            # The connection (or the host) went away: reconnect on the next attempt.
            if self.join is not None:
                self.join.stop_beating()
            self.store, self.join = None, None
        return AttemptFailed("store", f"the store at {self.master.name} failed during {self._phase}: {quote(exc)}")

    # between attempts -----------------------------------------------------------------------------
    def pause(self, seconds: float) -> None:
        """Sleep between attempts, but wake at once if the world completes meanwhile (joined ranks)."""
        self._paused_at = time.monotonic()
        end = self._paused_at + seconds
        join, generation, records = self.join, self.generation, self.log.records
        if join is not None and generation is not None and records and records[-1].phase == "join":
            state = f"{join.namespace}g{generation}/state"
            with contextlib.suppress(dist.DistError):  # the store went away: sleep out the pause
                if wait_for_key(join.store, state, end, sleep=self.handover.sleep, poll=join.pace.poll):
                    return
        self.handover.sleep(end - time.monotonic())

    def on_retry(self, number: int, failure: AttemptFailed, pause: float) -> None:
        """Mark attempt ``number`` as retried and log it."""
        self.log.mark_retried()
        self.log.log_failure(number, failure, pause, phase=self._phase, generation=self.generation)

    def give_up(self, last: AttemptFailed) -> NoReturn:
        """The deadline leaves no room for another attempt: raise the specific error or the timeout."""
        self.log.log_failure(len(self.log.records), last, None, phase=self._phase, generation=self.generation)
        if last.kind in SPECIFIC:
            raise specific_error(last, time.monotonic() - self.start, self.master) from last
        # The last attempt may have failed before it could count (e.g. the store host reached its own
        # deadline first and went away): name who was missing when last seen.
        missing = last.missing_ranks or self.log.last_missing() or ((0,) if last.kind == "refused" else ())
        raise self.timeout_error(missing=missing, attempts=self.log.lines(), last_kind=last.kind) from last

    def timeout_error(
        self, *, missing: tuple[int, ...], attempts: list[str], blocked: str | None = None, last_kind: str | None = None
    ) -> RendezvousTimeoutError:
        join = self.counted
        return _messages.rendezvous_timeout(
            rank=self.rank,
            world_size=self.world_size,
            master=self.master.name,
            deadline=self.bounds.deadline,
            missing=missing,
            attempts=attempts,
            generation=self.generation,
            blocked=blocked,
            last_kind=last_kind,
            hint=join.hint(missing, final=True) if join is not None else None,
        )

    # the thread's body and what the caller may ask -------------------------------------------------
    def run_attempts(self) -> None:
        """Attempt until the group forms, a verdict, or the deadline (the body of the rendezvous thread)."""
        try:
            try:
                retry_until(
                    self.attempt,
                    deadline_at=self.deadline_at,
                    backoff=self.backoff,
                    rng=self.rng,
                    pause=self.pause,
                    on_retry=self.on_retry,
                    give_up=self.give_up,
                )
            finally:  # however it ended, this rank no longer waits in the join
                if self.join is not None:
                    self.join.stop_beating()
        except BaseException as exc:
            if not self.handover.abandoned:
                raise
            # The caller gave up and holds no reference to this outcome: drop the store (closing the
            # client, or stopping the server on rank 0) so that no peer meets this call any more. The
            # frames of the traceback hold it too, in reference cycles (tenacity keeps the exception)
            # that only a full garbage collection would free: clear their locals now.
            self.store, self.join, self.counted = None, None, None
            _clear_frames(exc)

    def position(self) -> tuple[int, str, str, float]:
        """Where the attempts are now: (attempt number, phase or "the pause", in words, seconds there)."""
        number, begun = self._attempt
        paused_at, now = self._paused_at, time.monotonic()
        if paused_at is not None:
            words = f"the pause after attempt {number} blocked on the store for {now - paused_at:.1f} s"
            return number, "the pause", words, now - paused_at
        return number, self._phase, f"attempt {number} blocked in {self._phase} for {now - begun:.1f} s", now - begun


def _clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of every finished frame in ``exc``'s traceback and in its chained causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
