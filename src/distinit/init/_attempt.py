"""The attempt state machine of one ``init_with_retry`` call: reach the store, join, form the group, retry.

One attempt: reach the store (rank 0 hosts it; the others probe and connect), run the join protocol in
this call's namespace and the store's current generation, then form the group on that generation's
``PrefixStore``. A failure that waiting may cure is an :class:`AttemptFailed` and is retried with back-off
until the deadline; a misconfiguration verdict is raised at once. The attempts run in a thread that the
caller may abandon (:mod:`distinit.init._thread`); :meth:`Rendezvous.run` starts it and handles how it ended.

The attempt loop is tenacity's (:func:`retry_attempts`, the only importer of tenacity): it retries an
:class:`AttemptFailed` and nothing else, asks :func:`~distinit.init._policy.next_pause` (the pure schedule) how
long to pause or whether the deadline leaves no room, pauses with :meth:`Rendezvous.pause` and logs the
"retrying in ..." line before each pause. When no room is left, the last failure comes back to
:meth:`Rendezvous.give_up`, which raises the final error. What each attempt saw is kept in an :class:`AttemptLog`.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NoReturn

import torch
from torch.distributed import Store, TCPStore

from distinit._duration import to_timedelta
from distinit._foreign import first_line
from distinit._guarded import Call
from distinit._net import probe
from distinit.env import DistEnv
from distinit.errors import RankLostError, RendezvousError, RendezvousTimeoutError
from distinit.init import _messages, _store
from distinit.init._form import GroupFormer, InitWatch
from distinit.init._heartbeat import host_gone
from distinit.init._join import Frozen, HostSilent, JoinProtocol
from distinit.init._policy import (
    AttemptFailed,
    Backoff,
    Bounds,
    Grace,
    Unsupported,
    loss_bound,
    next_pause,
    quote,
)
from distinit.init._report import AttemptRecord, InitReport, Phase
from distinit.init._store import SPECIFIC, Master, connect_store, specific_error
from distinit.init._thread import PROCESS, Abandoned, Handover, leave_behind, run_guarded

if TYPE_CHECKING:  # imported where the attempts run (see retry_attempts)
    import tenacity

logger = logging.getLogger("distinit.init")


# the attempts' records -----------------------------------------------------------------------------------------
class AttemptLog:
    """What each attempt of one call saw, for the report, the error message and the log."""

    def __init__(self, *, rank: int, master: str, start: float, deadline_at: float) -> None:
        self.rank = rank
        self.master = master
        self.start = start
        self.deadline_at = deadline_at
        self.records: list[AttemptRecord] = []

    def record(
        self, *, number: int, begun: float, phase: Phase, generation: int | None, exc: BaseException | None
    ) -> None:
        """Append the record of attempt ``number`` (``exc`` None: it formed the group)."""
        failure = exc if isinstance(exc, AttemptFailed) else None
        self.records.append(
            AttemptRecord(
                number=number,
                generation=generation,
                phase=phase,
                elapsed=round(time.monotonic() - begun, 4),
                started_at=round(begun - self.start, 4),
                error=None if exc is None else (failure.kind if failure else type(exc).__name__),
                message=None if exc is None else first_line(failure.detail if failure else exc),
                missing_ranks=failure.missing_ranks if failure else (),
            )
        )

    def mark_retried(self) -> None:
        """The last attempt was followed by another."""
        last = self.records[-1]
        self.records[-1] = AttemptRecord.model_validate({**last.model_dump(), "retried": True})

    def last_missing(self) -> tuple[int, ...]:
        """The missing ranks of the latest attempt that counted them (empty if none did)."""
        return next((r.missing_ranks for r in reversed(self.records) if r.missing_ranks), ())

    def lines(self) -> list[str]:
        """One line per failed attempt, for the error message."""
        return [
            f"#{r.number} {r.phase} {r.elapsed:.1f} s{'' if r.error == r.phase else f' ({r.error})'}: {r.message}"
            for r in self.records
            if r.error
        ]

    def log_failure(
        self, number: int, failure: AttemptFailed, pause: float | None, *, phase: str, generation: int | None
    ) -> None:
        """The one structured record of a failed attempt (``pause`` None: the deadline ends the wait)."""
        phase = self.records[-1].phase if self.records else phase
        left = max(self.deadline_at - time.monotonic(), 0.0)
        then = f"retrying in {pause:.1f} s, {left:.0f} s left" if pause is not None else "the deadline ends the wait"
        logger.warning(
            "rank %d: rendezvous attempt %d at %s failed in %s (%s: %s); %s",
            self.rank,
            number,
            self.master,
            phase,
            failure.kind,
            failure.detail,
            then,
            extra={
                "distinit": {
                    "event": "init.attempt_failed",
                    "rank": self.rank,
                    "attempt": number,
                    "phase": phase,
                    "error": failure.kind,
                    "message": failure.detail,
                    "missing_ranks": list(failure.missing_ranks[:64]),
                    "generation": generation,
                    "elapsed_s": round(time.monotonic() - self.start, 3),
                    "pause_s": None if pause is None else round(pause, 3),
                    "left_s": round(left, 3),
                }
            },
        )


# one rendezvous call -------------------------------------------------------------------------------------------
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
        call: tuple[int, bool],
        watch_init: bool,
    ) -> None:
        """``call``: this call's number, and whether it resumes an interrupted call's (``Process.take_call``).

        ``watch_init``: gloo may meet the loopback trap here, so a peer's verdict is watched for during init.
        """
        self.start = bounds.started or time.monotonic()  # the deadline counts from the public call
        self.bounds, self.backend, self.backoff = bounds, backend, backoff
        self.deadline_at = self.start + bounds.deadline
        self.rank, self.world_size = env.rank, env.world_size
        self.master = Master(addr=env.master_addr or "127.0.0.1", port=env.master_port or 0, rank=env.rank)
        # torchrun's agent hosts the store (env's agent_store), so rank 0 connects like the others.
        self.agent = env.agent_store
        self.hosting = self.rank == 0 and not self.agent
        job = env.job_id or "job"
        self.launched = None if env.launched is None else (env.launched, env.launched_from())
        self.loss_bound = loss_bound(environ)
        number, self.resumed = call
        self.namespace = f"distinit/{job}/{env.restart_count}/c{number}/"
        self.rng = random.Random()
        self.grace = Grace(foreign=bounds.attempt_timeout)
        self.handover = Handover()
        self.former = GroupFormer(
            backend=backend,
            env=env,
            environ=environ,
            bounds=bounds,
            device_id=device_id,
            verify=verify,
            watch=InitWatch(self.master, env=env, hosting=self.hosting, enabled=watch_init),
        )
        self.log = AttemptLog(rank=self.rank, master=self.master.name, start=self.start, deadline_at=self.deadline_at)
        self.store: TCPStore | None = None
        self.join: JoinProtocol | None = None
        self.last_join: JoinProtocol | None = None
        self.generation: int | None = None
        self._phase: Phase = "store"
        self._attempt = (0, self.start)  # (number, monotonic start) of the attempt in progress
        self._woke_early = False  # the last pause ended early (the state key appeared, or the store failed)
        self._paused_at: float | None = None  # set while pausing between attempts
        #: What ended the attempts, for the caller (None: the group formed).
        self.raised: BaseException | None = None

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
                formed_by = min(time.monotonic() + self.bounds.attempt_timeout, self.deadline_at)
                self.former.form(join, generation, end=formed_by)
                if self.former.verify:
                    self._phase = "verify"
                self.former.check(join, generation, end=formed_by)
            except Unsupported as exc:
                self._unsupported(exc)
            except (RuntimeError, OSError) as exc:
                gone = self._host_gone(failed_at=time.monotonic())
                if gone is not None:
                    raise gone from exc
                raise self._lost(exc) from exc
        except (AttemptFailed, RendezvousError) as exc:
            self.log.record(number=number, begun=begun, phase=self._phase, generation=self.generation, exc=exc)
            if isinstance(exc, AttemptFailed):
                _store.escalate(self.grace, exc, since=time.monotonic(), master=self.master)
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
        join.wait(generation, end - time.monotonic(), stop=self.handover.gave_up)
        return join, generation

    def _open_store(self, end: float) -> None:
        if self.hosting:
            try:
                store = _store.host(self.master, end=end)
            except AttemptFailed as failure:
                if failure.kind == "port_busy":
                    self._claim_as_duplicate_master(end)
                raise
        else:
            store = _store.connect(self.master, end=end, grace=self.grace, rng=self.rng, stop=self.handover.gave_up)
        self.store, self.join = store, self._protocol(store)
        self.last_join = self.join  # what the join counted stays readable after the store is dropped

    def _claim_as_duplicate_master(self, end: float) -> None:
        """MASTER_PORT is taken: if its holder is a TCPStore where rank 0 is claimed, this is a duplicate rank 0.

        Then joining as a client publishes (and raises) ``DuplicateRankError`` naming both rank-0 processes.
        """
        port = self.master.port
        seen = probe("127.0.0.1", port, min(2.0, max(end - time.monotonic(), 0.1)), handshake_timeout=1.0)
        if seen.kind != "tcpstore":
            return
        try:
            store = connect_store("127.0.0.1", port, timeout=min(5.0, max(end - time.monotonic(), 0.5)))
        except AttemptFailed:
            return
        join = self._protocol(store, hosting=False)
        generation = join.generation()
        if join.claimed(generation, 0):
            join.enter(generation)

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

    def _host_gone(self, *, failed_at: float) -> RankLostError | None:
        """This rank joined and the store failed at ``failed_at``: is its host, rank 0, gone?

        Whatever the store call raised (a reset, EOF, a refusal, a timeout) is only the trigger: the probes
        of the master's port decide (:func:`~distinit.init._heartbeat.host_gone`).
        """
        join, generation = self.join, self.generation
        if self.hosting or self.agent or join is None or generation is None:
            return None
        seen = join.store_failed(failed_at)
        if isinstance(seen, Frozen):
            return _messages.frozen_self(
                rank=self.rank,
                claimant=seen.claimant,
                frozen_for=seen.frozen_for,
                stale=seen.stale,
                master=self.master.name,
                generation=generation,
            )
        if isinstance(seen, HostSilent):
            return host_gone(
                self.master,
                claimant=seen.claimant,
                generation=generation,
                since=failed_at,
                end=self.deadline_at,
                sleep=self.handover.sleep,
                stale=seen.stale,  # the join's loss bound (a user's loss_bound too), not the module's 5 s
            )
        return None  # not waiting in an incomplete join with rank 0 in it: the attempts handle it

    def _unsupported(self, failure: Unsupported) -> NoReturn:
        """A torch call failed in a way no retry cures: end the call now, and on every rank where possible.

        The verdict goes on the store when this rank joined one, so that the ranks waiting for it raise it too
        rather than wait for the deadline. Rank 0 failing to host the store has no store to tell them on: they
        see a refused port until their deadline (the error on rank 0 names the cause).
        """
        verdict = _messages.unsupported(
            step=failure.step, master=self.master.name, cause=quote(failure.cause), rank=self.rank
        )
        verdict.__cause__ = failure.cause
        logger.error("rank %d: %s", self.rank, verdict.what, extra={"distinit": {"event": "init.unsupported"}})
        join, generation = self.join, self.generation
        if join is not None and generation is not None:
            # The store may have gone away as well: then this rank's own verdict is what it knows.
            with contextlib.suppress(RuntimeError, OSError):
                join.fail(generation, verdict)
        raise verdict

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
        """Sleep between attempts, but wake at once if the world completes meanwhile (joined ranks).

        Also at once if the store fails meanwhile: the next attempt meets the failure and decides about the
        store host without the rest of the pause in between.
        """
        self._paused_at = time.monotonic()
        end = self._paused_at + seconds
        join, generation, records = self.join, self.generation, self.log.records
        woke, self._woke_early = self._woke_early, False
        if join is not None and generation is not None and records and records[-1].phase == "join" and not woke:
            # Never twice in a row: a store that keeps failing, or a state key someone keeps forging (refused by
            # the attempt, written again), must not turn the attempts into a spin; the pause then runs out.
            try:
                if join.wait_for_state(generation, end, stop=self.handover.gave_up):
                    self._woke_early = True
                    return  # the world completed (or a verdict came) during the pause
            except (RuntimeError, OSError):
                self._woke_early = True
                return  # the store went away: the next attempt meets it at once
        self.handover.sleep(end - time.monotonic())

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
        join = self.last_join
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
    def run_attempts(self, device: int | None = None) -> None:
        """The body of the rendezvous thread: attempt until the group forms, a verdict, or the deadline.

        What ended it is kept in :attr:`raised` for the caller. ``device``: the caller's CUDA device (the
        current device is per thread: carried over).
        """
        try:
            try:
                if device is not None:
                    torch.cuda.set_device(device)
                self._attempt_until_formed()
            finally:  # however it ended, this rank no longer waits in the join
                if self.join is not None:
                    self.join.stop_beating()
        except BaseException as exc:  # handed to the caller
            if not self.handover.abandoned:
                self.raised = exc
                return
            # The caller gave up and holds no reference to this outcome: drop the store (closing the
            # client, or stopping the server on rank 0) so that no peer meets this call any more. The
            # frames of the traceback hold it too, in reference cycles
            # that only a full garbage collection would free: clear their locals now.
            self.store, self.join, self.last_join = None, None, None
            _clear_frames(exc)

    def _attempt_until_formed(self) -> None:
        """Attempt until the group forms; a verdict ends it at once, the deadline with :meth:`give_up`."""
        last = retry_attempts(self.attempt, schedule=self._next_pause, pause=self.pause, on_retry=self._retrying)
        if last is not None:
            self.give_up(last)

    def _next_pause(self, number: int) -> float | None:
        """The schedule: the pause after failed attempt ``number``, None when the deadline leaves no room."""
        return next_pause(number, deadline_at=self.deadline_at, backoff=self.backoff, rng=self.rng)

    def _retrying(self, number: int, failure: AttemptFailed, pause: float) -> None:
        """Attempt ``number`` failed and another follows after ``pause`` s: mark its record and log it."""
        self.log.mark_retried()
        self.log.log_failure(number, failure, pause, phase=self._phase, generation=self.generation)

    def run(self) -> InitReport:
        """Run the attempts in a guarded thread; the report once the group formed, or raise what ended them."""
        _wait_for(self)
        report = _report(self)
        _log_done(report)
        return report

    def position(self) -> tuple[int, str, str, float]:
        """Where the attempts are now: (attempt number, phase or "the pause", in words, seconds there)."""
        number, begun = self._attempt
        paused_at, now = self._paused_at, time.monotonic()
        if paused_at is not None:
            words = f"the pause after attempt {number} blocked on the store for {now - paused_at:.1f} s"
            return number, "the pause", words, now - paused_at
        return number, self._phase, f"attempt {number} blocked in {self._phase} for {now - begun:.1f} s", now - begun


def retry_attempts(
    attempt: Callable[[int], None],
    *,
    schedule: Callable[[int], float | None],
    pause: Callable[[float], None],
    on_retry: Callable[[int, AttemptFailed, float], None],
) -> AttemptFailed | None:
    """Run ``attempt(1)``, ``attempt(2)``, ... with tenacity: None once one returns, or the last failure.

    tenacity runs the schedule; the decisions stay ours:

    * ``retry``: an :class:`AttemptFailed` only (the transient failures). Anything else an attempt raises -- a
      verdict (:class:`~distinit.errors.RendezvousError`), :class:`~distinit.init._thread.Abandoned`, a
      ``KeyboardInterrupt`` -- tenacity re-raises at once, unretried and unchanged;
    * ``stop`` and ``wait``: ``schedule(number)`` (:func:`~distinit.init._policy.next_pause`: None when the
      deadline leaves no room for another attempt), asked once per failed attempt, since it draws the jitter
      (tenacity before 8.3 asks ``stop`` first, later versions ``wait`` first);
    * ``before_sleep``: ``on_retry(number, failure, pause)``, the record and the "retrying in ..." line;
    * ``sleep``: ``pause``, which may end early (the world completed, the store failed) or raise
      ``Abandoned`` (the caller gave up);
    * ``retry_error_callback``: hands the last failure back, so tenacity's ``RetryError`` never escapes and the
      caller raises the final error itself, outside tenacity's frames.
    """
    # Imported here, not with the module: tenacity imports asyncio, and ``from distinit import setup`` does not
    # pay for it (the module list of ``benchmarks/bench_import.py`` watches both).
    import tenacity

    decided: dict[int, float | None] = {}
    current = 0

    def scheduled(state: tenacity.RetryCallState) -> float | None:
        number = state.attempt_number
        if number not in decided:
            decided[number] = schedule(number)
        return decided[number]

    def no_room(state: tenacity.RetryCallState) -> bool:
        return scheduled(state) is None

    def scheduled_pause(state: tenacity.RetryCallState) -> float:
        return scheduled(state) or 0.0

    def begin(state: tenacity.RetryCallState) -> None:
        nonlocal current
        current = state.attempt_number

    def retried(state: tenacity.RetryCallState) -> None:
        on_retry(state.attempt_number, _failure(state), scheduled_pause(state))

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(AttemptFailed),
        stop=no_room,
        wait=scheduled_pause,
        before=begin,
        before_sleep=retried,
        sleep=pause,
        retry_error_callback=_failure,
    )
    ended: object = retrying(lambda: attempt(current))
    return ended if isinstance(ended, AttemptFailed) else None


def _failure(state: tenacity.RetryCallState) -> AttemptFailed:
    """The failure that ended the attempt ``state`` describes (tenacity retries nothing else)."""
    failure = state.outcome.exception() if state.outcome is not None else None
    if not isinstance(failure, AttemptFailed):  # pragma: no cover - the retry predicate admits nothing else
        raise TypeError(f"tenacity retried {failure!r}, not an AttemptFailed")
    return failure


def _clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of every finished frame in ``exc``'s traceback and in its chained causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


# the caller's side ----------------------------------------------------------------------------------------------
def _wait_for(session: Rendezvous) -> None:
    """Run ``session``'s attempts in a guarded thread; return once the group formed, or raise what ended them."""
    device = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        device = torch.cuda.current_device()
    name = f"distinit-rendezvous-rank{session.rank}"
    call = Call(lambda: session.run_attempts(device), name=name)
    thread = call.thread
    outcome = run_guarded(call, deadline_at=session.deadline_at, handover=session.handover, early=session.former.watch)
    if outcome.kind == "interrupted":
        _interrupted(session, thread, formed=outcome.formed)
    elif outcome.kind == "verdict":
        leave_behind(thread, f"{name}: still in a native call after a peer's verdict", stuck=True)
    elif outcome.kind == "overrun" and session.raised is None:  # (else it ended on its own verdict just now)
        raise _overrun(session, thread)
    error = outcome.error or session.raised
    if error is not None:
        raise error


def _overrun(session: Rendezvous, thread: threading.Thread) -> RendezvousTimeoutError:
    """The thread is still blocked past the deadline: leave it behind and name what it is blocked in."""
    number, phase, blocked, lasted = session.position()
    leave_behind(thread, f"{blocked} at {session.master.name}", stuck=True)
    error = session.timeout_error(
        missing=session.log.last_missing(),
        attempts=[*session.log.lines(), f"#{number} {phase} {lasted:.1f} s: blocked, abandoned"],
        blocked=blocked,
    )
    logger.error(
        "rank %d: rendezvous at %s abandoned %.1f s past the deadline: %s",
        session.rank,
        session.master.name,
        time.monotonic() - session.deadline_at,
        blocked,
        extra={
            "distinit": {
                "event": "init.abandoned",
                "rank": session.rank,
                "attempt": number,
                "phase": phase,
                "generation": session.generation,
                "elapsed_s": round(time.monotonic() - session.start, 3),
            }
        },
    )
    return error


def _interrupted(session: Rendezvous, thread: threading.Thread, *, formed: bool) -> None:
    """The caller's wait was interrupted: no group may outlive that, and the call never happened."""
    if formed:
        thread.join()  # only the bookkeeping is left; then undo the group the caller will never see
        session.former.undo()
        return
    PROCESS.resume = True
    leave_behind(thread, f"interrupted, {session.position()[2]} at {session.master.name}", stuck=False)


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
