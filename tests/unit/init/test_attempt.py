"""init/_attempt.py's pure parts: the attempts' records, the launcher's facts a call takes from its world, and
the attempt loop.

How the launcher's own count and torchrun's agent store are resolved: tests/unit/env/test_launched.py. The loop
(:func:`retry_attempts`, tenacity running the schedule) is driven here without a Rendezvous: a fake attempt that
fails as told, a fake clock and a recorded pause.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from distinit.env import DistEnv, env_from_scheduler
from distinit.errors import RendezvousError
from distinit.init._attempt import AttemptLog, Rendezvous, retry_attempts
from distinit.init._policy import MIN_ATTEMPT, AttemptFailed, Backoff, Bounds, next_pause
from distinit.init._thread import Abandoned

SOURCE = Path(__file__).resolve().parents[3] / "src" / "distinit"


def test_the_log_keeps_one_record_per_attempt_and_the_last_missing_ranks() -> None:
    log = AttemptLog(rank=1, master="h:1", start=0.0, deadline_at=1e12)
    failure = AttemptFailed("join", "1/2 ranks joined generation 0, missing ranks 1", missing_ranks=(1,))
    log.record(number=1, begun=0.0, phase="join", generation=0, exc=failure)
    log.mark_retried()
    log.record(number=2, begun=0.0, phase="probe", generation=None, exc=AttemptFailed("refused", "nothing"))
    assert [r.retried for r in log.records] == [True, False]
    assert log.last_missing() == (1,)
    assert log.lines()[0].startswith("#1 join") and "(refused)" in log.lines()[1]


def _rendezvous(env: DistEnv, environ: dict[str, str]) -> Rendezvous:
    bounds = Bounds.of(deadline=10.0, attempt_timeout=5.0, pg_timeout=None)
    return Rendezvous(
        env=env, backend="gloo", bounds=bounds, device_id=None, verify=False, environ=environ,
        backoff=Backoff(), call=(1, False), watch_init=False,
    )  # fmt: skip


TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "r1",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "RANK": "0",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_the_attempts_take_the_launchers_facts_from_the_world_not_the_environment() -> None:
    """Resolved from torchrun's variables: its agent hosts the store and it started 2 of the 4 ranks."""
    session = _rendezvous(env_from_scheduler(TORCHRUN), environ={})
    assert (session.agent, session.hosting) == (True, False)
    assert session.launched == (2, "torchrun: LOCAL_WORLD_SIZE=2 x 1 node(s)")
    assert session.namespace == "distinit/r1/0/c1/"


def test_a_world_built_by_hand_says_what_it_says() -> None:
    """The variables around a hand-built world are not read: no agent store unless the world says so."""
    env = DistEnv(rank=0, local_rank=0, world_size=4, launcher="torchrun", master_addr="127.0.0.1", master_port=1)
    session = _rendezvous(env, environ=TORCHRUN)
    assert (session.agent, session.hosting, session.launched) == (False, True, None)
    assert session.namespace == "distinit/job/0/c1/"
    told = DistEnv.model_validate({**env.model_dump(), "agent_store": True, "launched": 2})
    session = _rendezvous(told, environ={})
    assert (session.agent, session.hosting, session.launched) == (True, False, (2, "launched=2"))


class Script:
    """A fake attempt that raises what it is told, attempt by attempt, on a fake clock; and the loop's hooks."""

    def __init__(self, outcomes: list[BaseException | None], *, lasts: float = 1.0) -> None:
        self.outcomes = outcomes
        self.lasts = lasts  # seconds each attempt takes on the fake clock
        self.now = 0.0
        self.numbers: list[int] = []
        self.pauses: list[float] = []
        self.retried: list[tuple[int, str, float]] = []

    def attempt(self, number: int) -> None:
        self.numbers.append(number)
        self.now += self.lasts
        outcome = self.outcomes[number - 1] if number <= len(self.outcomes) else None
        if outcome is not None:
            raise outcome

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def on_retry(self, number: int, failure: AttemptFailed, pause: float) -> None:
        self.retried.append((number, failure.kind, pause))

    def run(self, *, deadline_at: float = 1e9) -> AttemptFailed | None:
        def by_backoff(number: int) -> float | None:
            policy = Backoff(initial=1.0, factor=2.0, cap=30.0, jitter=0.0)
            return next_pause(number, deadline_at=deadline_at, backoff=policy, rng=random.Random(0), clock=self.clock)

        return retry_attempts(self.attempt, schedule=by_backoff, pause=self.pause, on_retry=self.on_retry)

    def clock(self) -> float:
        return self.now


def refused(n: int) -> list[BaseException | None]:
    return [AttemptFailed("refused", f"attempt {i + 1}: nothing listens") for i in range(n)]


def test_the_loop_retries_failures_on_the_schedule_until_an_attempt_forms_the_group() -> None:
    script = Script([*refused(3), None])
    assert script.run() is None
    assert script.numbers == [1, 2, 3, 4]  # numbered from 1, one number per attempt
    assert script.pauses == [1.0, 2.0, 4.0]  # next_pause's schedule, asked once per failure
    assert script.retried == [(1, "refused", 1.0), (2, "refused", 2.0), (3, "refused", 4.0)]


def test_the_loop_hands_back_the_last_failure_when_the_deadline_leaves_no_room() -> None:
    script = Script(refused(100), lasts=3.0)
    last = script.run(deadline_at=9.0)
    # 3 s attempt, 1 s pause, 3 s attempt, a pause clamped from 2 s so that MIN_ATTEMPT is left, a last attempt.
    assert script.numbers == [1, 2, 3]
    assert script.pauses == [1.0, 9.0 - 7.0 - MIN_ATTEMPT]
    assert isinstance(last, AttemptFailed) and last.detail == "attempt 3: nothing listens"  # never a RetryError
    assert [number for number, _, _ in script.retried] == [1, 2]  # the last failure is not logged as retried


def test_a_schedule_with_no_room_after_the_first_failure_ends_after_one_attempt() -> None:
    script = Script(refused(5))
    last = retry_attempts(script.attempt, schedule=lambda n: None, pause=script.pause, on_retry=script.on_retry)
    assert isinstance(last, AttemptFailed) and script.numbers == [1] and script.pauses == [] == script.retried


def test_the_schedule_is_asked_once_per_failed_attempt() -> None:
    # It draws the jitter: a second call would draw again. tenacity asks stop and wait (in either order).
    asked: list[int] = []

    def schedule(number: int) -> float | None:
        asked.append(number)
        return 0.5 if number < 3 else None

    script = Script(refused(5))
    retry_attempts(script.attempt, schedule=schedule, pause=script.pause, on_retry=script.on_retry)
    assert asked == [1, 2, 3] and script.pauses == [0.5, 0.5]


@pytest.mark.parametrize(
    "verdict",
    [
        pytest.param(RendezvousError("rank 1 was claimed twice"), id="verdict"),
        pytest.param(Abandoned(), id="abandoned"),
        pytest.param(KeyboardInterrupt(), id="ctrl-c"),
        pytest.param(SystemExit(3), id="exit"),
        pytest.param(RuntimeError("a bare torch error"), id="foreign"),
    ],
)
def test_anything_but_a_failed_attempt_passes_through_at_once_unchanged(verdict: BaseException) -> None:
    script = Script([*refused(1), verdict])
    with pytest.raises(type(verdict)) as raised:
        script.run()
    assert raised.value is verdict  # the very object: no RetryError, no wrapping
    assert script.numbers == [1, 2] and script.pauses == [1.0]


def test_a_pause_that_raises_ends_the_loop() -> None:
    # The caller gave up during the pause (Handover.sleep raises Abandoned): no further attempt.
    script = Script(refused(3))

    def gave_up(seconds: float) -> None:
        raise Abandoned

    with pytest.raises(Abandoned):
        retry_attempts(script.attempt, schedule=lambda n: 1.0, pause=gave_up, on_retry=script.on_retry)
    assert script.numbers == [1] and len(script.retried) == 1


def _imports(node: ast.AST, *, lazy: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import under ``node``, and whether it is lazy (in a function body or under ``if TYPE_CHECKING``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, lazy
        deferred = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
            isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING")
        )
        yield from _imports(child, lazy=lazy or deferred)


def test_tenacity_is_imported_only_where_the_attempts_run() -> None:
    # tenacity imports asyncio: ``from distinit import setup`` must not pay for it. Every ``import tenacity`` in
    # the package is inside a function body or under ``if TYPE_CHECKING`` (read from the source, not imported).
    found: dict[str, bool] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        for node, lazy in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(name.split(".")[0] == "tenacity" for name in names):
                found[f"{path.relative_to(SOURCE)}:{node.lineno}"] = lazy
    assert found and all(found.values()), found  # found: the scan sees the lazy import itself
    assert {where.split(":")[0] for where in found} == {"init/_attempt.py"}  # tenacity stays in one module
