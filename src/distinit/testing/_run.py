"""The parent side of ``run_distributed``: start ranks, watch them, tear them down, report.

Ranks are ``forkserver`` children (``_supervise``). The fork server preloads torch once per test
process, so after the first call a rank starts in tens of milliseconds instead of paying the
1.3-1.8 s torch import. Rendezvous is race-free: a ``FileStore`` in a fresh temporary directory (no
port at all), or, when the ranks must find ``MASTER_ADDR``/``MASTER_PORT`` themselves
(``init=False``), a ``TCPStore`` that this process binds to port 0 and keeps open while the ranks
connect as clients.

This module imports no torch at import time (the plugin is loaded into every pytest session).

Writes launcher variables itself: it plays the launcher for its ranks (``LOCAL_WORLD_SIZE``, and
``TORCHELASTIC_USE_AGENT_STORE=True`` when they meet at the ``TCPStore`` this process hosts).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import Any, NoReturn, TypeAlias

from distinit._duration import to_seconds
from distinit.testing._child import ModuleHint, Task
from distinit.testing._output import read_tail, wait_for_dumps
from distinit.testing._pool import Pool, acquire, release
from distinit.testing._report import RankOutcome, build_error, prefix_lines
from distinit.testing._supervise import RankProcess, start_ranks, stop_all

__all__ = ["DistWorld", "run_distributed", "run_with_modules"]

log = logging.getLogger("distinit.testing")

#: How long the other ranks may still report after the first failure before they are torn down.
FAILURE_GRACE = 0.5
#: How long the ranks may take to start (the fork server imports torch once per test process; on an
#: overloaded machine that alone took 10 s). The ``timeout`` of a run starts when every rank runs.
STARTUP_TIMEOUT = 120.0


def _module_hints(fn: Callable[..., Any]) -> tuple[ModuleHint, ...]:
    """The modules a child must load before unpickling ``fn`` (it pickles by reference)."""
    target: Any = fn
    while hasattr(target, "func"):  # functools.partial and friends
        target = target.func
    target = getattr(target, "__func__", target)  # bound/static methods
    name = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise TypeError(
            f"run_distributed() needs a function the rank processes can import, got {qualname!r}: "
            "lambdas and functions defined inside other functions cannot be sent to another process; "
            "define it at module level (a test module is fine)"
        )
    if not isinstance(name, str):
        return ()
    module = sys.modules.get(name)
    return (_hint_for(name, module),) if module is not None else (ModuleHint(name, None),)


def _hint_for(name: str, module: ModuleType) -> ModuleHint:
    file = getattr(module, "__file__", None)
    rewritten = "@pytest_ar" in vars(module)
    return ModuleHint(name, os.path.abspath(file) if isinstance(file, str) else None, rewritten)


def _rank_env(
    base: Mapping[str, str], rank: int, world_size: int, extra: Mapping[str, str], store_env: Mapping[str, str]
) -> dict[str, str]:
    env = dict(base)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
        }
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(store_env)
    env.update(extra)
    return env


EnvSpec: TypeAlias = Mapping[str, str] | Callable[[int], Mapping[str, str]] | None


def _env_for(env: EnvSpec, rank: int) -> dict[str, str]:
    """The extra variables of one rank (``env`` may be one mapping for all or a function of the rank)."""
    values = env(rank) if callable(env) else (env or {})
    for key, value in values.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {key!r}: {value!r} for rank {rank}")
    return dict(values)


def _check_arguments(world_size: int, timeout: float | timedelta, gpus_per_rank: int) -> float:
    """Validate the arguments; the timeout in seconds."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if isinstance(gpus_per_rank, bool) or not isinstance(gpus_per_rank, int) or gpus_per_rank < 0:
        raise ValueError(f"gpus_per_rank must be an integer >= 0, got {gpus_per_rank!r}")
    return to_seconds(timeout, "timeout")


def run_distributed(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str = "gloo",
    timeout: float | timedelta = 30.0,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: EnvSpec = None,
    *,
    init: bool = True,
    reuse: bool = False,
    gpus_per_rank: int = 0,
    label: str = "",
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` once per rank, each in its own process, and return the results.

    Every rank runs in a fresh process (or, with ``reuse=True``, a pooled one) with the default
    process group initialised on ``backend`` and ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
    ``LOCAL_WORLD_SIZE`` set. If any rank fails, the others are torn down (stacks dumped) and one
    :class:`~distinit.errors.DistributedTestError` lists every failed rank.

    Args:
        fn: a module-level function (a test module is fine); it is sent to the ranks by reference.
        world_size: number of ranks.
        backend: torch.distributed backend (``"gloo"`` on CPU, ``"nccl"`` with GPUs).
        timeout: seconds (or a ``timedelta``) for the whole call; on expiry the ranks still running
            are reported as hung, with their Python stacks, and killed with their process trees.
        args: positional arguments for ``fn`` (pickled).
        kwargs: keyword arguments for ``fn`` (pickled).
        env: variables added to each rank's environment (after the defaults, so they win), or a
            function ``rank -> variables`` (e.g. ``lambda r: scheduler_env("slurm", ..., rank=r)``).
        init: initialise the default process group before calling ``fn``. With ``False`` the ranks
            get ``MASTER_ADDR``/``MASTER_PORT`` of a store this process owns, marked
            ``TORCHELASTIC_USE_AGENT_STORE=True`` as torchrun does, so ``init_process_group()``
            with ``env://`` joins without racing for a port.
        reuse: run on pooled rank processes kept alive between calls (no process start cost); a
            failure discards the pool, so it never leaks into the next call.
        gpus_per_rank: GPUs each rank needs (rank r uses device ``r * gpus_per_rank``).
        label: a name for the report (the test id, when run from the pytest plugin).

    Returns:
        The per-rank return values, index = rank.

    Raises:
        DistributedTestError: one or more ranks raised, exited non-zero, died by a signal or hung.
        ValueError: bad ``world_size``, ``gpus_per_rank`` or ``timeout`` (not > 0, NaN or infinite).
        TypeError: ``fn`` cannot be sent to another process, ``args``/``kwargs`` do not pickle, or
            ``timeout`` is not a number of seconds or a ``timedelta``.
    """
    __tracebackhide__ = True
    bound = DistWorld(label)
    return bound(
        fn, world_size, backend, timeout, args, kwargs, env, init=init, reuse=reuse, gpus_per_rank=gpus_per_rank
    )


def run_with_modules(
    fn: Callable[..., Any],
    *,
    world_size: int,
    backend: str,
    timeout: float | timedelta,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    env: EnvSpec = None,
    init: bool,
    reuse: bool,
    gpus_per_rank: int,
    label: str,
    modules: Sequence[ModuleType] = (),
    deadline: float | None = None,
) -> list[Any]:
    """``run_distributed`` that also loads ``modules`` in the ranks first (the plugin's test modules).

    ``deadline`` (``time.monotonic()``) is a hard limit on top of ``timeout``: the plugin sets it so
    that distinit reports before pytest-timeout interrupts the test.
    """
    __tracebackhide__ = True
    seconds = _check_arguments(world_size, timeout, gpus_per_rank)
    if not label:
        # Under pytest, name the test in the report even when called directly.
        label = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[0]
    rank_envs = [_env_for(env, rank) for rank in range(world_size)]
    hints = tuple(_hint_for(m.__name__, m) for m in modules) + _module_hints(fn)
    try:
        payload = pickle.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as exc:
        raise TypeError(f"run_distributed() could not pickle fn, args or kwargs for the ranks: {exc}") from exc
    run = _Run(
        world_size=world_size,
        backend=backend,
        timeout=seconds,
        payload=payload,
        hints=hints,
        env=rank_envs,
        init=init,
        reuse=reuse,
        gpus_per_rank=gpus_per_rank,
        label=label,
        deadline=deadline,
    )
    return run.execute()


class DistWorld:
    """``run_distributed`` bound to the current test (its id labels the report).

    Call it exactly like :func:`distinit.testing.run_distributed`.
    """

    __module__ = "distinit.testing"  # its public home: reprs and pickles never name a private module

    def __init__(self, label: str, *, deadline: float | None = None) -> None:
        self.label = label
        #: time.monotonic() by which a call must have reported (set under pytest-timeout), or None.
        self.deadline = deadline

    def __call__(
        self,
        fn: Callable[..., Any],
        world_size: int = 2,
        backend: str = "gloo",
        timeout: float | timedelta = 30.0,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        env: EnvSpec = None,
        *,
        init: bool = True,
        reuse: bool = False,
        gpus_per_rank: int = 0,
    ) -> list[Any]:
        """Run ``fn`` on ``world_size`` ranks; see :func:`distinit.testing.run_distributed`."""
        __tracebackhide__ = True
        return run_with_modules(
            fn,
            world_size=world_size,
            backend=backend,
            timeout=timeout,
            args=args,
            kwargs=kwargs,
            env=env,
            init=init,
            reuse=reuse,
            gpus_per_rank=gpus_per_rank,
            label=self.label,
            deadline=self.deadline,  # report (with the stacks) before pytest-timeout interrupts
        )


@dataclass
class _Run:
    world_size: int
    backend: str
    timeout: float
    payload: bytes
    hints: tuple[ModuleHint, ...]
    env: list[dict[str, str]]
    init: bool
    reuse: bool
    gpus_per_rank: int
    label: str
    deadline: float | None = None
    outcomes: list[RankOutcome] = field(default_factory=list)
    #: the timeout the report states: ``timeout``, or less when ``deadline`` cut the run short
    effective_timeout: float = 0.0

    def execute(self) -> list[Any]:
        """Start (or borrow) the ranks, hand each its task, watch them, and report or return."""
        __tracebackhide__ = True
        run_id = uuid.uuid4().hex[:12]
        out_dir = tempfile.mkdtemp(prefix=f"distinit-{run_id}-")
        tcp_store: Any = None
        pool: Pool | None = None
        ranks: list[RankProcess] = []
        poisoned = True
        try:
            tcp_store = None if self.init else _tcp_store(self.timeout)
            started = time.monotonic()
            if self.reuse:
                pool = acquire(self.world_size, self.backend)
                ranks = pool.ranks
            else:
                ranks = start_ranks(self.world_size, reuse=False)
            self.outcomes = [RankOutcome(rank, reuse=self.reuse) for rank in range(self.world_size)]
            self._send_tasks(ranks, run_id=run_id, out_dir=out_dir, tcp_store=tcp_store)
            try:
                self._watch(ranks, started=started)
            except BaseException as exc:
                self._report_interruption(ranks, out_dir, exc)
                raise
            results = self._finish(ranks, out_dir)
            poisoned = not self.reuse
            return results
        finally:
            if pool is not None:
                release(pool, self.backend, poisoned=poisoned)
            else:
                stop_all(ranks)
            del tcp_store
            shutil.rmtree(out_dir, ignore_errors=True)

    def _send_tasks(self, ranks: list[RankProcess], *, run_id: str, out_dir: str, tcp_store: Any) -> None:
        """Send each rank its task: the payload, its environment, and where to rendezvous."""
        store: tuple[str, str, int] = ("file", os.path.join(out_dir, "store"), 0)
        store_env: dict[str, str] = {}
        if tcp_store is not None:
            store = ("tcp", "127.0.0.1", int(tcp_store.port))
            store_env = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(tcp_store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
            }
        base_env = dict(os.environ)
        for rank, process in enumerate(ranks):
            task = Task(
                run_id=run_id,
                rank=rank,
                world_size=self.world_size,
                backend=self.backend,
                timeout=self.timeout,
                payload=self.payload,
                modules=self.hints,
                env=_rank_env(base_env, rank, self.world_size, self.env[rank], store_env),
                store=store,
                init=self.init,
                out_dir=out_dir,
                gpus_per_rank=self.gpus_per_rank,
            )
            with contextlib.suppress(OSError, ValueError):
                process.conn.send(task)  # a rank that already died is reported from its exit status

    def _report_interruption(self, ranks: list[RankProcess], out_dir: str, exc: BaseException) -> None:
        """Interrupted from outside (pytest-timeout's signal method, ^C): stop every rank, say where each was."""
        self._stop_pending(ranks, out_dir, verdict="interrupted")
        self._collect_output(out_dir)
        error = build_error(
            self.outcomes,
            world_size=self.world_size,
            backend=self.backend,
            timeout=self.effective_timeout or self.timeout,
            label=self.label,
        )
        log.error(
            "the ranks were torn down when the test was interrupted: %s",
            error.what,
            extra={"distinit": {"event": "testing.interrupted", "label": self.label}},
        )
        if hasattr(exc, "add_note"):  # Python >= 3.11: the full report, stacks included
            exc.add_note(f"distinit: the ranks were torn down when the test was interrupted:\n{error}")

    def _finish(self, ranks: list[RankProcess], out_dir: str) -> list[Any]:
        """The per-rank results; or stop the ranks still running and raise (or skip) with the report."""
        __tracebackhide__ = True
        if any(not o.succeeded for o in self.outcomes):
            verdict = "stopped" if any(o.failed for o in self.outcomes) else "hung"
            self._stop_pending(ranks, out_dir, verdict=verdict)
            self._collect_output(out_dir)
            self._raise_or_skip()
        self._collect_output(out_dir)
        self._forward_output()
        return [pickle.loads(o.result) for o in self.outcomes if o.result is not None]

    def _limit(self, *, started: float, run_started: float | None, first_failure: float | None) -> float:
        """When the watch ends: the startup bound or the timeout, capped by the deadline and the grace."""
        limit = started + STARTUP_TIMEOUT if run_started is None else run_started + self.timeout
        if self.deadline is not None:
            limit = min(limit, self.deadline)
        if first_failure is not None:
            limit = min(limit, first_failure + FAILURE_GRACE)
        return limit

    def _watch(self, ranks: list[RankProcess], *, started: float) -> None:
        """Wait until every rank settled, the timeout passed, or the grace after a failure ran out.

        The timeout runs from the moment every rank is running (has sent its first message), so
        the fork server's one-off torch import does not eat a test's timeout; starting itself is
        bounded by ``STARTUP_TIMEOUT``. ``self.deadline`` caps both.
        """
        first_failure: float | None = None
        run_started: float | None = None
        sequence = 0
        self.effective_timeout = self.timeout
        while pending := [o for o in self.outcomes if not o.settled(reuse=self.reuse)]:
            now = time.monotonic()
            if run_started is None and all(o.phase != "start" or o.settled(reuse=self.reuse) for o in self.outcomes):
                run_started = now
            limit = self._limit(started=started, run_started=run_started, first_failure=first_failure)
            if now >= limit:
                if run_started is not None and first_failure is None:
                    self.effective_timeout = min(self.timeout, round(now - run_started, 1))
                elif run_started is None:
                    self.effective_timeout = round(now - started, 1)
                return
            waitables = _waitables(pending, ranks)
            if not waitables:
                return
            multiprocessing.connection.wait(waitables, timeout=limit - now)
            for outcome in pending:
                _poll(outcome, ranks[outcome.rank])
            for outcome in pending:
                if outcome.failed:
                    sequence += 1
                    outcome.failed_seq = sequence
                    if first_failure is None:
                        first_failure = time.monotonic()

    def _stop_pending(self, ranks: list[RankProcess], out_dir: str, *, verdict: str) -> None:
        """Dump the stacks of ranks still running, then kill every rank's process tree."""
        pending = [o for o in self.outcomes if not o.settled(reuse=self.reuse) and o.exitcode is None]
        dumping = []
        for outcome in pending:
            outcome.verdict = verdict
            if outcome.phase == "start":
                continue  # faulthandler is not registered yet: SIGUSR1 would just kill it
            if ranks[outcome.rank].signal(signal.SIGUSR1):
                dumping.append(outcome)
        if dumping:
            wait_for_dumps([os.path.join(out_dir, f"rank{o.rank}.stack") for o in dumping])
        for process in ranks:
            process.kill()

    def _collect_output(self, out_dir: str) -> None:
        for outcome in self.outcomes:
            outcome.stdout = read_tail(os.path.join(out_dir, f"rank{outcome.rank}.stdout"))
            outcome.stderr = read_tail(os.path.join(out_dir, f"rank{outcome.rank}.stderr"))
            if outcome.verdict in ("hung", "stopped", "interrupted"):
                outcome.stack = read_tail(os.path.join(out_dir, f"rank{outcome.rank}.stack"))

    def _raise_or_skip(self) -> NoReturn:
        __tracebackhide__ = True
        skips = [o.skip for o in self.outcomes if o.skip is not None]
        if len(skips) == self.world_size and len({kind for kind, _ in skips}) == 1:
            verb = "skipped" if skips[0][0] == "skip" else "xfailed"
            _raise_outcome(skips[0][0], f"all {self.world_size} ranks {verb}: {skips[0][1]}")
        raise build_error(
            self.outcomes,
            world_size=self.world_size,
            backend=self.backend,
            timeout=self.effective_timeout or self.timeout,
            label=self.label,
        )

    def _forward_output(self) -> None:
        for outcome in self.outcomes:
            if outcome.stdout:
                sys.stdout.write(prefix_lines(outcome.stdout, outcome.rank))
            if outcome.stderr:
                sys.stderr.write(prefix_lines(outcome.stderr, outcome.rank))


def _waitables(pending: list[RankOutcome], ranks: list[RankProcess]) -> list[Any]:
    """What to wait on for the ranks still pending: their pipe (until closed) and their exit."""
    waitables: list[Any] = []
    for outcome in pending:
        process = ranks[outcome.rank]
        if not outcome.conn_closed:
            waitables.append(process.conn)
        if outcome.exitcode is None:
            waitables.append(process.process.sentinel)
    return waitables


def _poll(outcome: RankOutcome, process: RankProcess) -> None:
    """Apply every message the rank has sent, and its exit status once it exited."""
    exited = outcome.exitcode is None and not process.process.is_alive()
    while not outcome.conn_closed:
        try:
            if not process.conn.poll():
                break
            message = process.conn.recv()
        except (EOFError, OSError):
            outcome.conn_closed = True
            break
        outcome.record(message)
    if exited:
        process.process.join(0)
        outcome.exitcode = process.process.exitcode


def _raise_outcome(kind: str, reason: str) -> NoReturn:
    """Skip or xfail the calling test, reported at the test's location (not this module's)."""
    __tracebackhide__ = True
    import pytest

    if kind == "xfail":
        pytest.xfail(reason)
    raise pytest.skip.Exception(reason, _use_item_location=True)


def _tcp_store(timeout: float) -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
