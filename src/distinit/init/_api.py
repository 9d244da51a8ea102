"""``init_with_retry``: a bounded, diagnosing, retrying ``torch.distributed`` rendezvous."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, PrefixStore, Store, TCPStore
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import RendezvousError, RendezvousTimeoutError
from distinit.init import _messages, _preflight
from distinit.init._attempt import AttemptFailed, FailureKind
from distinit.init._backoff import Backoff
from distinit.init._join import JoinProtocol
from distinit.init._probe import port_holder, probe
from distinit.init._report import AttemptRecord, InitReport, Phase
from distinit.init._retry import retry_until
from distinit.init._store import connect_store, host_store

logger = logging.getLogger("distinit.init")

#: Grace periods (seconds) before a persisting failure becomes an error, clamped to the deadline.
DNS_GRACE = 60.0
UNREACHABLE_GRACE = 10.0
PORT_GRACE = 30.0
#: One reachability probe's connect bound, and its store-handshake bound.
PROBE_TIMEOUT = 5.0
HANDSHAKE_TIMEOUT = 3.0
#: Seconds past the deadline that the caller waits for a rendezvous thread stuck in a native call before it
#: raises anyway (torch's store client has no receive timeout: a frozen store host blocks it forever).
OVERRUN_GRACE = 2.0


def _default_pg_timeout(backend: str) -> timedelta:
    """Return torch's default collective timeout for ``backend`` (10 min NCCL, 30 min others)."""
    if backend == "nccl" and default_pg_nccl_timeout is not None:
        return default_pg_nccl_timeout
    return default_pg_timeout


def _seconds(value: float | timedelta, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise ValueError(f"{name} must be positive seconds, got {value!r}")
    return seconds


def _choose_backend(backend: str | None, env: DistEnv, device_id: int | torch.device | None) -> str:
    if backend is not None:
        return backend
    if device_id is not None:
        return "nccl"
    if torch.cuda.is_available() and env.local_rank < torch.cuda.device_count():
        return "nccl"
    return "gloo"


def _reset_group_counter() -> bool:
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


class _Process:
    """Process-wide state of rendezvous calls.

    ``calls`` counts them (each gets a fresh store namespace); ``abandoned`` is the rendezvous thread given
    up at a deadline while still blocked, if any, and what it is blocked in.
    """

    calls = 0
    abandoned: tuple[threading.Thread, str] | None = None


def _check_no_abandoned(rank: int) -> None:
    """Refuse a new rendezvous while an abandoned one is still blocked in this process."""
    if _Process.abandoned is None:
        return
    thread, what = _Process.abandoned
    if not thread.is_alive():
        _Process.abandoned = None
        return
    raise RendezvousError(
        f"rank {rank}: an earlier rendezvous of this process is still blocked ({what}); a new one would race it",
        rank=rank,
        why="the earlier init_with_retry() raised RendezvousTimeoutError while a store or network call was stuck "
        "in native code, which nothing can interrupt.",
        fix="exit and restart the process (let the launcher restart it) instead of retrying in it.",
    )


def _last_missing(records: list[AttemptRecord]) -> tuple[int, ...]:
    """The missing ranks of the latest attempt that counted them (empty if none did)."""
    return next((r.missing_ranks for r in reversed(records) if r.missing_ranks), ())


class _Rendezvous:
    """The state of one ``init_with_retry`` call: store, join protocol, attempt records."""

    def __init__(
        self,
        *,
        env: DistEnv,
        backend: str,
        deadline: float,
        attempt_timeout: float,
        pg_timeout: timedelta | None,
        device_id: int | torch.device | None,
        verify: bool,
        environ: Mapping[str, str],
        backoff: Backoff,
    ) -> None:
        self.start = time.monotonic()
        self.deadline = deadline
        self.deadline_at = self.start + deadline
        self.attempt_timeout = attempt_timeout
        self.pg_timeout = pg_timeout
        self.device_id = device_id
        self.verify = verify
        self.backend = backend
        self.backoff = backoff
        self.rank = env.rank
        self.world_size = env.world_size
        self.addr = env.master_addr or "127.0.0.1"
        self.port = env.master_port or 0
        self.master = f"{self.addr}:{self.port}"
        self.agent = env.launcher == "torchrun" and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self.hosting = self.rank == 0 and not self.agent
        job = env.job_id or environ.get("TORCHELASTIC_RUN_ID") or "job"
        # Every init_with_retry call of this process gets its own namespace: the k-th call of each rank
        # meets the k-th call of the others (setup/teardown/setup), even if an old store outlived teardown.
        _Process.calls += 1
        self.namespace = f"distinit/{job}/{env.restart_count}/c{_Process.calls}/"
        self.rng = random.Random()
        self.store: TCPStore | None = None
        self.join: JoinProtocol | None = None
        self.generation: int | None = None
        self.records: list[AttemptRecord] = []
        self.counter_resets = 0
        self._streak: tuple[FailureKind, float] | None = None
        self._phase: Phase = "store"
        self._attempt = (0, self.start)  # (number, monotonic start) of the attempt in progress
        self._paused_at: float | None = None  # set while pausing between attempts
        # Guards the hand-over between the rendezvous thread and the caller waiting for it (see run()).
        self._lock = threading.Lock()
        self._abandoned = False
        self._formed = False

    # the attempt ----------------------------------------------------------------------------------
    def attempt(self, number: int) -> None:
        begun = time.monotonic()
        self._attempt, self._paused_at = (number, begun), None
        end = min(begun + self.attempt_timeout, self.deadline_at)
        self._phase = "probe" if not self.hosting else "store"
        try:
            try:
                if self.join is None:
                    self._open_store(end)
                join = self.join
                if join is None or self.store is None:  # pragma: no cover - _open_store sets both or raises
                    raise AttemptFailed("store", "no store")
                # A failed init restored the collective timeout on the store: bound this attempt's calls again.
                self.store.set_timeout(timedelta(seconds=max(end - time.monotonic(), 1.0)))
                self._phase = "join"
                generation = join.generation()
                self.generation = generation
                join.enter(generation)
                join.wait(generation, end - time.monotonic())
                # Every rank joined: init gets a bound of its own. Ranks that waited long for a late peer
                # would otherwise start init with scraps of their attempt while the late rank has all of
                # its own, give up first, and fall a generation out of phase with it.
                self._phase = "init"
                self._init_process_group(
                    join, generation, min(time.monotonic() + self.attempt_timeout, self.deadline_at)
                )
            except (dist.DistError, RuntimeError, OSError) as exc:
                raise self._lost(exc) from exc
        except (AttemptFailed, RendezvousError) as exc:
            self._record(number, begun, exc)
            if isinstance(exc, AttemptFailed):
                self._escalate(exc)
            raise
        with self._lock:
            abandoned, self._formed = self._abandoned, not self._abandoned
        if abandoned:
            # The caller already raised RendezvousTimeoutError: do not leave a group behind it.
            self._cleanup()
            raise RendezvousError(
                f"rank {self.rank}: the process group formed after the caller gave up; destroyed again",
                rank=self.rank,
                master=self.master,
            )
        self._phase = "done"
        self._record(number, begun, None)

    def _lost(self, exc: BaseException) -> AttemptFailed:
        """A torch/socket error outside the phases that translate their own: the store failed."""
        text = str(exc).strip().splitlines()
        head = f"{type(exc).__name__}: {text[0][:200] if text else ''}"
        if not self.hosting:
            # The connection (or the host) went away: reconnect on the next attempt.
            self.store, self.join = None, None
        return AttemptFailed("store", f"the store at {self.master} failed during {self._phase}: {head}")

    def _open_store(self, end: float) -> None:
        if self.hosting:
            self._host(end)
        else:
            self._connect(end)

    def _host(self, end: float) -> None:
        try:
            socket.getaddrinfo(self.addr, self.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise AttemptFailed("dns", f"MASTER_ADDR={self.addr!r} does not resolve ({exc})") from exc
        try:
            store = host_store(self.addr, self.port, timeout=max(end - time.monotonic(), 1.0))
        except AttemptFailed as busy:
            if busy.kind == "port_busy":
                self._check_duplicate_master(end)
            raise
        self.store = store
        self.join = self._protocol(store)

    def _check_duplicate_master(self, end: float) -> None:
        """The port is taken: if the holder is a TCPStore where rank 0 is claimed, we are a duplicate rank 0."""
        seen = probe("127.0.0.1", self.port, min(2.0, max(end - time.monotonic(), 0.1)), handshake_timeout=1.0)
        if seen.kind != "tcpstore":
            return
        try:
            store = connect_store("127.0.0.1", self.port, timeout=min(5.0, max(end - time.monotonic(), 0.5)))
        except AttemptFailed:
            return
        join = self._protocol(store, hosting=False)
        generation = join.generation()
        if store.check([f"{join.namespace}g{generation}/claim/0"]):
            join.enter(generation)  # publishes DuplicateRankError naming both rank-0 processes

    def _connect(self, end: float) -> None:
        # Start polling fast (a master binding its port right now is the common case at start-up: a
        # refused connect on a LAN costs microseconds), then back off to one probe per 2 s.
        interval = 0.02
        failure: AttemptFailed | None = None
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise failure or AttemptFailed("refused", f"nothing listened on {self.master} within the attempt")
            probed_at = time.monotonic()
            seen = probe(self.addr, self.port, min(PROBE_TIMEOUT, left), handshake_timeout=min(HANDSHAKE_TIMEOUT, left))
            logger.debug("rank %d: probe of %s: %s (%s)", self.rank, self.master, seen.kind, seen.detail)
            if seen.kind == "tcpstore":
                self._streak = None
                store = connect_store(self.addr, self.port, timeout=max(end - time.monotonic(), 1.0))
                self.store = store
                self.join = self._protocol(store)
                return
            kind: FailureKind = "store" if seen.kind == "error" else seen.kind
            failure = AttemptFailed(kind, f"{self.master}: {seen.detail}")
            self._escalate(failure, since=probed_at)
            left = end - time.monotonic()
            if left <= 0:
                raise failure
            time.sleep(min(left, interval + self.rng.uniform(0, interval / 2)))
            interval = min(interval * 1.5, 2.0)

    def _protocol(self, store: Store, *, hosting: bool | None = None) -> JoinProtocol:
        return JoinProtocol(
            store,
            namespace=self.namespace,
            rank=self.rank,
            world_size=self.world_size,
            master=self.master,
            hosting=self.hosting if hosting is None else hosting,
            deadline=self.deadline,
        )

    def _init_process_group(self, join: JoinProtocol, generation: int, end: float) -> None:
        store = self.store
        if store is None:  # pragma: no cover - joined implies a store
            raise AttemptFailed("store", "no store")
        bound = timedelta(seconds=max(end - time.monotonic(), 1.0))
        store.set_timeout(bound)
        # The backend bootstrap waits on peers' keys with the *group* timeout, not the store's: init with
        # the attempt bound, then restore the collective timeout (private API, feature-detected).
        set_pg_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        try:
            dist.init_process_group(
                self.backend,
                store=PrefixStore(join.prefix(generation), store),
                rank=self.rank,
                world_size=self.world_size,
                timeout=bound if set_pg_timeout is not None else self.pg_timeout,
                device_id=self.device_id,
            )
            if self.verify:
                self._phase = "verify"
                self._check_collective(end)
            if set_pg_timeout is not None:
                set_pg_timeout(self.pg_timeout or _default_pg_timeout(self.backend))
        except (ValueError, TypeError) as exc:
            self._cleanup()
            raise RendezvousError(
                f"rank {self.rank}: init_process_group rejected its arguments: {exc}",
                rank=self.rank,
                why="an argument (backend, device_id, pg_timeout) does not fit this torch build or host.",
                fix="check the arguments passed to init_with_retry()/setup().",
                master=self.master,
                generation=generation,
            ) from exc
        except (dist.DistError, RuntimeError, OSError) as exc:
            self._cleanup()
            # If the store is gone too, the next attempt reconnects and reads the generation anew.
            with contextlib.suppress(dist.DistError, RuntimeError):
                join.abandon(generation)
            text = str(exc).strip().splitlines()
            raise AttemptFailed(
                "init",
                f"init_process_group failed in generation {generation} after every rank joined: "
                f"{type(exc).__name__}: {text[0][:200] if text else ''}",
            ) from exc
        finally:
            if self.store is not None:
                self.store.set_timeout(self.pg_timeout or _default_pg_timeout(self.backend))

    def _check_collective(self, end: float) -> None:
        device: torch.device | None = None
        if isinstance(self.device_id, torch.device):
            device = self.device_id
        elif isinstance(self.device_id, int):
            device = torch.device("cuda", self.device_id)
        elif self.backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        tensor = torch.ones(1, device=device)
        work = dist.all_reduce(tensor, async_op=True)
        if work is None or not work.wait(timeout=timedelta(seconds=max(end - time.monotonic(), 1.0))):
            raise RuntimeError("the check all_reduce did not complete")
        if int(tensor.item()) != self.world_size:
            raise RuntimeError(f"the check all_reduce summed to {tensor.item()} instead of {self.world_size}")

    def _cleanup(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except (RuntimeError, AssertionError, ValueError) as exc:
                logger.debug("rank %d: destroy_process_group after a failed init: %s", self.rank, exc)
        if _reset_group_counter():
            self.counter_resets += 1

    # escalation and records -----------------------------------------------------------------------
    def _escalate(self, failure: AttemptFailed, *, since: float | None = None) -> None:
        """Turn a failure that persisted past its grace period into the specific error.

        ``since``: when the observation that failed began (a probe that waited 3 s for a handshake saw the
        failure from its start), so that the grace counts from the first sign of it.
        """
        now = time.monotonic()
        if self._streak is None or self._streak[0] != failure.kind:
            self._streak = (failure.kind, now if since is None else since)
        lasted = now - self._streak[1]
        if failure.kind == "dns" and lasted >= DNS_GRACE:
            raise self._specific(failure, lasted)
        if failure.kind == "unreachable" and lasted >= UNREACHABLE_GRACE:
            raise self._specific(failure, lasted)
        if failure.kind == "port_busy" and lasted >= PORT_GRACE:
            raise self._specific(failure, lasted)
        if failure.kind == "foreign" and lasted >= self.attempt_timeout:
            raise self._specific(failure, lasted)

    def _specific(self, failure: AttemptFailed, lasted: float) -> RendezvousError:
        detail = failure.detail.split(": ", 1)[-1]
        if failure.kind == "dns":
            return _messages.cannot_resolve(
                master=self.master, host=self.addr, seconds=lasted, detail=detail, rank=self.rank
            )
        if failure.kind == "unreachable":
            return _messages.unroutable(master=self.master, seconds=lasted, detail=detail, rank=self.rank)
        if failure.kind == "timeout":
            return _messages.black_hole(master=self.master, seconds=lasted, rank=self.rank)
        if failure.kind == "port_busy":
            return _messages.port_in_use(
                master=self.master, port=self.port, seconds=lasted, holder=port_holder(self.port), rank=self.rank
            )
        holder = port_holder(self.port) if self.addr in ("127.0.0.1", "localhost", socket.gethostname()) else None
        return _messages.foreign_listener(master=self.master, seconds=lasted, holder=holder, rank=self.rank)

    def _record(self, number: int, begun: float, exc: BaseException | None) -> None:
        now = time.monotonic()
        message = None
        if exc is not None:
            message = (exc.detail if isinstance(exc, AttemptFailed) else str(exc)).splitlines()[0][:300]
        self.records.append(
            AttemptRecord(
                number=number,
                generation=self.generation,
                phase=self._phase,
                elapsed=round(now - begun, 4),
                started_at=round(begun - self.start, 4),
                error=None if exc is None else (exc.kind if isinstance(exc, AttemptFailed) else type(exc).__name__),
                message=message,
                missing_ranks=exc.missing_ranks if isinstance(exc, AttemptFailed) else (),
            )
        )

    def on_retry(self, number: int, failure: AttemptFailed, pause: float) -> None:
        last = self.records[-1]
        self.records[-1] = AttemptRecord.model_validate({**last.model_dump(), "retried": True})
        self._log_failure(number, failure, pause)

    def _log_failure(self, number: int, failure: AttemptFailed, pause: float | None) -> None:
        """The one structured record of a failed attempt (``pause`` None: the deadline ends the wait)."""
        phase = self.records[-1].phase if self.records else self._phase
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
                    "generation": self.generation,
                    "elapsed_s": round(time.monotonic() - self.start, 3),
                    "pause_s": None if pause is None else round(pause, 3),
                    "left_s": round(left, 3),
                }
            },
        )

    def pause(self, seconds: float) -> None:
        """Sleep between attempts, but wake at once if the world completes meanwhile (joined ranks)."""
        self._paused_at = time.monotonic()
        join, generation = self.join, self.generation
        if join is not None and generation is not None and self.records and self.records[-1].phase == "join":
            try:
                join.store.wait([f"{join.namespace}g{generation}/state"], timedelta(seconds=max(seconds, 0.01)))
                return
            except dist.DistError:
                pass
        time.sleep(max(seconds, 0.0))

    def give_up(self, last: AttemptFailed) -> NoReturn:
        self._log_failure(len(self.records), last, None)
        lasted = time.monotonic() - self.start
        if last.kind in ("dns", "unreachable", "timeout", "foreign", "port_busy"):
            raise self._specific(last, lasted) from last
        # The last attempt may have failed before it could count (e.g. the store host reached its own
        # deadline first and went away): name who was missing when last seen.
        missing = last.missing_ranks or _last_missing(self.records) or ((0,) if last.kind == "refused" else ())
        raise _messages.rendezvous_timeout(
            rank=self.rank,
            world_size=self.world_size,
            master=self.master,
            deadline=self.deadline,
            missing=missing,
            attempts=self._attempt_lines(list(self.records)),
            generation=self.generation,
        ) from last

    @staticmethod
    def _attempt_lines(records: list[AttemptRecord]) -> list[str]:
        return [
            f"#{r.number} {r.phase} {r.elapsed:.1f} s{'' if r.error == r.phase else f' ({r.error})'}: {r.message}"
            for r in records
            if r.error
        ]

    def overrun(self, thread: threading.Thread) -> RendezvousTimeoutError | None:
        """Give up on a rendezvous thread still blocked past the deadline (None: it formed the group meanwhile).

        The thread is left behind, blocked in a native call nothing can interrupt, and recorded so that
        another rendezvous in this process is refused while it lives; if that call ever returns and the
        group forms, :meth:`attempt` destroys it again.
        """
        with self._lock:
            if self._formed:
                return None
            self._abandoned = True
        number, begun = self._attempt
        phase: str = self._phase
        paused_at = self._paused_at
        now = time.monotonic()
        records = list(self.records)
        if paused_at is not None:
            phase, begun = "the pause", paused_at
            blocked = f"the pause after attempt {number} blocked on the store for {now - begun:.1f} s"
        else:
            blocked = f"attempt {number} blocked in {phase} for {now - begun:.1f} s"
        _Process.abandoned = (thread, f"{blocked} at {self.master}")
        error = _messages.rendezvous_timeout(
            rank=self.rank,
            world_size=self.world_size,
            master=self.master,
            deadline=self.deadline,
            missing=_last_missing(records),
            attempts=[*self._attempt_lines(records), f"#{number} {phase} {now - begun:.1f} s: blocked, abandoned"],
            generation=self.generation,
            blocked=blocked,
        )
        logger.error(
            "rank %d: rendezvous at %s abandoned %.1f s past the deadline: %s",
            self.rank,
            self.master,
            now - self.deadline_at,
            blocked,
            extra={
                "distinit": {
                    "event": "init.abandoned",
                    "rank": self.rank,
                    "attempt": number,
                    "phase": phase,
                    "generation": self.generation,
                    "elapsed_s": round(now - self.start, 3),
                }
            },
        )
        return error

    def run(self) -> None:
        """Run the attempts in a helper thread that the caller stops waiting for at the deadline.

        torch's TCPStore client reads replies without a timeout (only ``wait`` has one), and gloo's bootstrap
        reads through it: a store host that stops answering while its TCP connection stays up (frozen,
        SIGSTOPped, swapped out, behind a lossy link) blocks such a read for as long as TCP keeps retrying,
        which is many minutes. No Python-level bound can interrupt it, so the rendezvous runs in a daemon
        thread and the caller raises :class:`RendezvousTimeoutError` :data:`OVERRUN_GRACE` seconds after
        the deadline if the thread is still blocked.
        """
        outcome: list[BaseException] = []
        device = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            device = torch.cuda.current_device()  # the CUDA current device is per thread: carry it over

        def body() -> None:
            try:
                if device is not None:
                    torch.cuda.set_device(device)
                retry_until(
                    self.attempt,
                    deadline_at=self.deadline_at,
                    backoff=self.backoff,
                    rng=self.rng,
                    pause=self.pause,
                    on_retry=self.on_retry,
                    give_up=self.give_up,
                )
            except BaseException as exc:  # handed to the caller below
                outcome.append(exc)

        thread = threading.Thread(target=body, name=f"distinit-rendezvous-rank{self.rank}", daemon=True)
        thread.start()
        thread.join(max(self.deadline_at + OVERRUN_GRACE - time.monotonic(), 0.0))
        if thread.is_alive():
            error = self.overrun(thread)
            if error is None:
                thread.join()  # formed just now: only the bookkeeping is left
            elif not outcome:  # (else it ended on its own verdict just now: raise that one)
                raise error
        if outcome:
            raise outcome[0]

    def report(self, store_kind: str) -> InitReport:
        return InitReport.model_validate(
            {
                "backend": self.backend,
                "rank": self.rank,
                "world_size": self.world_size,
                "master": self.master,
                "store": store_kind,
                "generation": self.generation,
                "attempts": tuple(self.records),
                "elapsed": round(time.monotonic() - self.start, 4),
                "group_counter_reset": self.counter_resets,
            }
        )


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

    Pre-flight checks run first (local, instant). Rank 0 then hosts one TCPStore for the whole deadline
    (under torchrun every rank uses the agent's store instead); the other ranks probe it, classifying
    why it cannot be reached. A join protocol on the store checks that all ranks agree on the world size
    and that no rank is claimed twice, and only then ``init_process_group`` runs, on a per-generation
    ``PrefixStore``. Failed attempts are cleaned up (including torch's leaked group counter,
    pytorch/pytorch#46561) and retried with ``backoff`` pauses. Misconfiguration is never retried.

    ``deadline`` bounds rendezvous only; collectives afterwards use ``pg_timeout`` (torch's default when
    None). Calling it again with a compatible group already initialised returns at once.

    Args:
        backend: ``"gloo"``, ``"nccl"``, ...; None picks NCCL when CUDA is available and this rank's
            ``local_rank`` names a GPU (or ``device_id`` is given), else gloo.
        env: the world; default :func:`distinit.env_from_scheduler()`.
        deadline: total seconds (or timedelta) for rendezvous, across attempts.
        attempt_timeout: one attempt's bound, clamped to what is left of the deadline.
        pg_timeout: the process group's collective timeout after init.
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
            process group already initialised).
        SchedulerEnvError: MASTER_ADDR/MASTER_PORT missing or malformed (from ``env`` resolution too).
        ValueError: ``deadline``/``attempt_timeout`` not positive.
    """
    deadline_s = _seconds(deadline, "deadline")
    attempt_s = _seconds(attempt_timeout, "attempt_timeout")
    pg = None if pg_timeout is None else timedelta(seconds=_seconds(pg_timeout, "pg_timeout"))
    world = env if env is not None else env_from_scheduler()
    chosen = _choose_backend(backend, world, device_id)
    _preflight.check_world(rank=world.rank, world_size=world.world_size)
    _check_no_abandoned(world.rank)
    if _preflight.check_existing(backend=chosen, rank=world.rank, world_size=world.world_size):
        return InitReport(
            backend=chosen,
            rank=world.rank,
            world_size=world.world_size,
            master=f"{world.master_addr}:{world.master_port}" if world.master_addr else None,
            store="existing",
            elapsed=0.0,
            already_initialized=True,
        )
    _preflight.check_master(
        master_addr=world.master_addr, master_port=world.master_port, world_size=world.world_size, rank=world.rank
    )
    _preflight.check_backend(chosen, rank=world.rank)
    _preflight.check_interfaces(chosen, os.environ, rank=world.rank)
    if world.world_size == 1 and not (world.master_addr and world.master_port):
        # A world of one needs no network: a local store, as composer does.
        started = time.monotonic()
        dist.init_process_group(chosen, store=HashStore(), rank=0, world_size=1, timeout=pg, device_id=device_id)
        return InitReport(
            backend=chosen,
            rank=0,
            world_size=1,
            store="hosted",
            generation=0,
            attempts=(AttemptRecord(number=1, generation=0, phase="done", elapsed=0.0, started_at=0.0),),
            elapsed=round(time.monotonic() - started, 4),
        )
    session = _Rendezvous(
        env=world,
        backend=chosen,
        deadline=deadline_s,
        attempt_timeout=attempt_s,
        pg_timeout=pg,
        device_id=device_id,
        verify=verify,
        environ=os.environ,
        backoff=backoff or Backoff(),
    )
    session.run()
    report = session.report("agent" if session.agent else "hosted" if session.hosting else "client")
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
    return report
