"""What :class:`~distinit.init._attempt.Rendezvous` decides in one attempt, between two, and at the deadline.

``attempt`` runs on torch's in-process ``HashStore`` with the real join protocol and a fake group former (no
``init_process_group``): which phase a failure is recorded in, what a torch error becomes, what an unsupported
call publishes, and that a group the caller gave up on is undone. ``pause`` is driven with a fake join (the
early wake and its "never twice in a row"), and ``give_up`` with hand-made failures (the specific error or the
timeout, and which ranks it names).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import pytest
from torch.distributed import HashStore, Store

from distinit._board import text
from distinit.env import DistEnv
from distinit.errors import MasterUnreachableError, PortInUseError, RendezvousError, RendezvousTimeoutError
from distinit.init import _store
from distinit.init._attempt import Rendezvous
from distinit.init._form import GroupFormer
from distinit.init._join import JoinProtocol, Keys
from distinit.init._policy import AttemptFailed, Backoff, Bounds, Grace, Unsupported
from distinit.init._report import Phase
from distinit.init._thread import Abandoned


class Former:
    """Stands in for :class:`~distinit.init._form.GroupFormer`: forms nothing, fails where told."""

    def __init__(
        self, *, verify: bool = False, form: BaseException | None = None, check: BaseException | None = None
    ) -> None:
        self.verify = verify
        self._form, self._check = form, check
        self.formed: list[int] = []
        self.undone = 0
        self.on_form: Callable[[], object] = lambda: None

    def form(self, join: JoinProtocol, generation: int, *, end: float) -> None:
        assert end > time.monotonic()  # init gets a bound of its own
        self.formed.append(generation)
        self.on_form()
        if self._form is not None:
            raise self._form

    def check(self, join: JoinProtocol, generation: int, *, end: float) -> None:
        if self._check is not None:
            raise self._check

    def undo(self) -> None:
        self.undone += 1


def _session(*, world_size: int = 1, rank: int = 0, agent: bool = False, deadline: float = 30.0) -> Rendezvous:
    env = DistEnv(
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        launcher="torchrun",
        master_addr="127.0.0.1",
        master_port=29999,
        agent_store=agent,
    )
    bounds = Bounds.of(deadline=deadline, attempt_timeout=10.0, pg_timeout=None)
    return Rendezvous(
        env=env, backend="gloo", bounds=bounds, device_id=None, verify=False, environ={},
        backoff=Backoff(), call=(1, False), watch_init=False,
    )  # fmt: skip


def _on_store(session: Rendezvous, former: Former) -> HashStore:
    """Give ``session`` an in-process store (as if reached) and ``former`` in place of the real group former."""
    store = HashStore()
    session.store = store  # type: ignore[assignment]  # an in-process store where the TCPStore would be
    session.join = JoinProtocol(
        cast(Store, store),
        namespace=session.namespace,
        rank=session.rank,
        world_size=session.world_size,
        master=session.master.name,
        hosting=session.hosting,
    )
    session.former = cast(GroupFormer, former)
    return store


# attempt ------------------------------------------------------------------------------------------------------
def test_an_attempt_that_forms_the_group_claims_it_and_records_done() -> None:
    session, former = _session(), Former()
    _on_store(session, former)
    session.attempt(1)
    assert former.formed == [0] and former.undone == 0
    assert [(r.number, r.phase, r.generation, r.error) for r in session.log.records] == [(1, "done", 0, None)]
    assert not session.handover.abandon()  # the thread claimed the group: too late to give it up


def test_a_group_formed_after_the_caller_gave_up_is_undone_and_never_recorded() -> None:
    session, former = _session(), Former()
    _on_store(session, former)
    former.on_form = session.handover.abandon  # the caller gives up while init runs
    with pytest.raises(Abandoned):
        session.attempt(1)
    assert former.undone == 1 and session.log.records == []


def test_an_attempt_after_the_caller_gave_up_does_nothing() -> None:
    session, former = _session(), Former()
    _on_store(session, former)
    session.handover.abandon()
    with pytest.raises(Abandoned):
        session.attempt(1)
    assert former.formed == [] and session.log.records == []


@pytest.mark.parametrize(
    ("verify", "where", "phase"),
    [
        pytest.param(False, "form", "init", id="init"),
        pytest.param(True, "form", "init", id="init-before-verify"),
        pytest.param(True, "check", "verify", id="verify"),
        pytest.param(False, "check", "init", id="check-without-verify-is-init"),
    ],
)
def test_a_failure_is_recorded_in_the_phase_it_happened_in(verify: bool, where: str, phase: str) -> None:
    failure = AttemptFailed("init", "init_process_group failed")
    former = Former(verify=verify, **{where: failure})
    session = _session()
    _on_store(session, former)
    with pytest.raises(AttemptFailed) as raised:
        session.attempt(1)
    assert raised.value is failure
    assert [(r.phase, r.error, r.message) for r in session.log.records] == [
        (phase, "init", "init_process_group failed")
    ]


def test_a_join_that_does_not_complete_is_a_join_failure_naming_the_missing() -> None:
    session, former = _session(world_size=3), Former()
    _on_store(session, former)
    session.deadline_at = time.monotonic() + 0.3  # the attempt ends with the deadline
    try:
        with pytest.raises(AttemptFailed) as raised:
            session.attempt(1)
    finally:
        assert session.join is not None
        session.join.stop_beating()
    assert raised.value.kind == "join" and raised.value.missing_ranks == (1, 2)
    record = session.log.records[0]
    assert (record.phase, record.error, record.missing_ranks, record.generation) == ("join", "join", (1, 2), 0)
    assert former.formed == []  # never formed on an incomplete world


def test_a_torch_error_on_the_store_host_is_a_store_failure_and_keeps_the_store() -> None:
    session, former = _session(), Former(form=RuntimeError("Connection reset by peer"))
    _on_store(session, former)
    with pytest.raises(AttemptFailed) as raised:
        session.attempt(1)
    assert raised.value.kind == "store" and "failed during init: RuntimeError: Connection reset" in raised.value.detail
    assert session.store is not None and session.join is not None  # rank 0 serves the store: it stays


def test_a_torch_error_on_a_client_drops_the_store_to_reconnect() -> None:
    session, former = _session(agent=True), Former(form=OSError("Broken pipe"))  # torchrun's agent hosts the store
    _on_store(session, former)
    with pytest.raises(AttemptFailed) as raised:
        session.attempt(1)
    assert raised.value.kind == "store" and "OSError: Broken pipe" in raised.value.detail
    assert session.store is None and session.join is None  # the next attempt connects again
    assert session.log.records[0].phase == "init"


def test_an_unsupported_call_ends_the_call_at_once_with_its_verdict() -> None:
    cause = TypeError("init_process_group() got an unexpected keyword argument 'device_id'")
    session, former = _session(agent=True), Former(form=Unsupported("initialise the process group", cause))
    store = _on_store(session, former)
    with pytest.raises(RendezvousError) as raised:
        session.attempt(1)
    assert type(raised.value) is RendezvousError and raised.value.__cause__ is cause
    assert "cannot initialise the process group" in raised.value.what and "TypeError" in raised.value.what
    assert session.log.records[0].error == "RendezvousError"
    # Published on the join's board, first writer wins: the world had formed ("ok"), which stays.
    assert text(store.get(Keys(f"{session.namespace}g0/").state)) == "ok"


def test_a_failure_past_its_grace_becomes_its_specific_error() -> None:
    failure = AttemptFailed("dns", "MASTER_ADDR='nowhere' does not resolve ([Errno -2] Name or service not known)")
    session, former = _session(), Former(form=failure)
    _on_store(session, former)
    session.grace = Grace(foreign=10.0, dns=0.0)  # no grace left for a DNS failure
    with pytest.raises(MasterUnreachableError) as raised:
        session.attempt(1)
    assert "Name or service not known" in str(raised.value) and session.log.records[0].error == "dns"


def test_a_failure_within_its_grace_is_retried() -> None:
    failure = AttemptFailed("dns", "MASTER_ADDR='nowhere' does not resolve")
    session, former = _session(), Former(form=failure)
    _on_store(session, former)
    with pytest.raises(AttemptFailed):  # the default DNS grace has not run out
        session.attempt(1)


# pause -----------------------------------------------------------------------------------------------------------
class Join:
    """Stands in for the join during a pause: ``wait_for_state`` answers as told."""

    def __init__(self, answer: bool | BaseException) -> None:
        self.answer = answer
        self.asked: list[tuple[int, float]] = []

    def wait_for_state(self, generation: int, end: float, *, stop: object = None) -> bool:
        self.asked.append((generation, end))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def stop_beating(self) -> None:
        pass


def _paused(answer: bool | BaseException, *, phase: Phase = "join") -> tuple[Rendezvous, Join, list[float]]:
    session, join, slept = _session(), Join(answer), list[float]()
    session.join, session.generation = cast(JoinProtocol, join), 4
    failure = AttemptFailed("join" if phase == "join" else "refused", "x")
    session.log.record(number=1, begun=time.monotonic(), phase=phase, generation=4, exc=failure)
    session.handover.sleep = slept.append  # type: ignore[method-assign,assignment]
    return session, join, slept


def test_a_pause_after_a_join_failure_ends_when_the_world_completes() -> None:
    session, join, slept = _paused(True)
    session.pause(20.0)
    assert [g for g, _ in join.asked] == [4] and slept == []  # woke on the state key: no sleep
    assert join.asked[0][1] == pytest.approx(time.monotonic() + 20.0, abs=1.0)  # waits at most the pause
    session.pause(20.0)  # never twice in a row: the next pause runs out
    assert len(join.asked) == 1 and slept == [pytest.approx(20.0, abs=0.5)]
    session.pause(20.0)  # and the one after may wake early again
    assert len(join.asked) == 2


def test_a_pause_ends_at_once_when_the_store_fails() -> None:
    session, join, slept = _paused(RuntimeError("Connection reset by peer"))
    session.pause(20.0)
    assert len(join.asked) == 1 and slept == []


def test_a_pause_with_no_completion_sleeps_what_is_left() -> None:
    session, join, slept = _paused(False)
    session.pause(20.0)
    assert len(join.asked) == 1 and len(slept) == 1 and slept[0] <= 20.0


def test_a_pause_after_a_failure_outside_the_join_only_sleeps() -> None:
    session, join, slept = _paused(True, phase="probe")
    session.pause(3.0)
    assert join.asked == [] and slept == [pytest.approx(3.0, abs=0.5)]
    _, phase, words, _ = session.position()
    assert phase == "the pause" and words.startswith("the pause after attempt 0")


# give_up ---------------------------------------------------------------------------------------------------------
def test_giving_up_on_a_specific_failure_raises_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store, "port_holder", lambda port: f"pid 77 (python serve.py :{port})")
    session = _session()
    last = AttemptFailed("port_busy", "cannot bind MASTER_PORT=29999: address already in use")
    with pytest.raises(PortInUseError) as raised:
        session.give_up(last)
    assert raised.value.__cause__ is last and "pid 77 (python serve.py :29999)" in str(raised.value)


@pytest.mark.parametrize(
    ("last", "earlier", "missing"),
    [
        pytest.param(AttemptFailed("join", "2/4", missing_ranks=(2, 3)), (), (2, 3), id="the-last-join-names"),
        pytest.param(AttemptFailed("store", "reset"), (1,), (1,), id="an-earlier-join-names"),
        pytest.param(AttemptFailed("refused", "nothing listens"), (), (0,), id="refused-names-the-host"),
        pytest.param(AttemptFailed("store", "reset"), (), (), id="nobody-named"),
    ],
)
def test_giving_up_names_the_ranks_last_seen_missing(
    last: AttemptFailed, earlier: tuple[int, ...], missing: tuple[int, ...]
) -> None:
    session = _session(world_size=4)
    if earlier:
        before = AttemptFailed("join", "3/4", missing_ranks=earlier)
        session.log.record(number=1, begun=time.monotonic(), phase="join", generation=0, exc=before)
    with pytest.raises(RendezvousTimeoutError) as raised:
        session.give_up(last)
    assert raised.value.ranks == missing and raised.value.__cause__ is last
    if missing:
        assert f"missing ranks {list(missing)}" in str(raised.value)
    else:
        assert "no world of size 4 formed" in str(raised.value)
