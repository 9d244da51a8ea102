"""Whether the store host (rank 0) left: the pure judgement, the sign of each probe result, the probing loop, and
who rank 0 is, known before its store can die (issue 34). What real probes of real listeners (and of a real
TCPStore) say is tested in ``tests/integration/init/test_host_gone_socket.py``.

The flake behind these tests: a SIGKILLed process's kernel closes its established sockets before its listener,
so right after a survivor's store call failed (reset or EOF), the first probe of the port was often accepted by
the dying listener and reset (20 of 30 on a loaded 2-core machine); that one probe ended the decision as "something
answers" and the survivors retried until the deadline instead of naming rank 0.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import cast

import pytest
from torch.distributed import HashStore, Store

from distinit._net import ProbeKind, ProbeResult
from distinit.errors import RankLostError
from distinit.init._heartbeat import PROBE_EVERY, Heartbeat, host_gone
from distinit.init._join import Claimant, Frozen, HostSilent, JoinProtocol, Keys
from distinit.init._policy import STALE, AttemptFailed, StoreSign, judge_store_host, store_sign
from distinit.init._store import Master

MASTER = Master(addr="127.0.0.1", port=29500, rank=1)
RESET = ProbeResult("foreign", "the listener broke the store handshake ([Errno 104] Connection reset by peer)", 0.0)
EOF = ProbeResult("foreign", "the listener closed the connection without answering the store handshake", 0.0)
SILENT = ProbeResult("foreign", "the listener accepted but did not answer the store handshake in 1.0 s", 1.0)
REFUSED = ProbeResult("refused", "connection refused: nothing listens on the port yet", 0.0)
STORE = ProbeResult("tcpstore", "a TCPStore answered", 0.0)
BLACK_HOLE = ProbeResult("timeout", "no answer to connect within 1.0 s: packets vanish", 1.0)


# ------------------------------------------------------------------------------------------- the judgement
@pytest.mark.parametrize(
    ("seen", "since_failure", "verdict"),
    [
        pytest.param([], 0.0, "probe", id="nothing-seen-yet"),
        pytest.param(["absent"], 0.0, "probe", id="refused-at-once-is-not-yet-gone"),
        pytest.param(["absent"] * 20, 4.9, "probe", id="refused-for-less-than-the-bound"),
        pytest.param(["absent"] * 21, 5.0, "gone", id="refused-for-the-bound"),
        pytest.param(["absent", "absent"], 5.2, "gone", id="the-count-starts-at-the-failure-not-the-first-probe"),
        pytest.param(["absent", *["absent"] * 20], 5.1, "gone", id="a-dying-listener-then-refusals"),
        pytest.param(["unclear", "absent", "absent"], 5.1, "gone", id="unanswered-while-dying-then-refused"),
        pytest.param(["absent", "serving"], 1.0, "retry", id="a-restarted-rank-0-answers"),
        pytest.param(["absent"] * 20 + ["serving"], 5.0, "retry", id="answers-at-the-bound"),
        pytest.param(["network"], 0.0, "retry", id="the-network-fails-the-attempts-name-it"),
        pytest.param(["absent", "network"], 3.0, "retry", id="refused-then-the-network-fails"),
        pytest.param(["unclear"] * 6, 6.0, "retry", id="a-frozen-host-is-not-named"),
        pytest.param(["absent", "unclear"], 6.0, "probe", id="unclear-after-absent-looks-again"),
        pytest.param(["absent", "unclear", "absent"], 7.0, "gone", id="absent-again"),
    ],
)
def test_judge_store_host(seen: list[StoreSign], since_failure: float, verdict: str) -> None:
    assert judge_store_host(seen, since_failure=since_failure, stale=STALE) == verdict


@pytest.mark.parametrize(
    ("kind", "detail", "sign"),
    [
        pytest.param("tcpstore", STORE.detail, "serving", id="a-store"),
        pytest.param("refused", REFUSED.detail, "absent", id="refused"),
        pytest.param("foreign", RESET.detail, "absent", id="accepted-then-reset"),
        pytest.param("foreign", EOF.detail, "absent", id="accepted-then-eof"),
        pytest.param("foreign", "the listener answered the store handshake with foreign bytes", "absent", id="bytes"),
        pytest.param("foreign", SILENT.detail, "unclear", id="accepted-no-answer"),
        pytest.param("error", "connect failed: [Errno 99] whatever", "unclear", id="another-socket-error"),
        pytest.param("timeout", BLACK_HOLE.detail, "network", id="black-hole"),
        pytest.param("dns", "name resolution failed", "network", id="dns"),
        pytest.param("unreachable", "Network is unreachable (errno 101)", "network", id="no-route"),
    ],
)
def test_store_sign(kind: ProbeKind, detail: str, sign: StoreSign) -> None:
    assert store_sign(kind, detail) == sign


# ------------------------------------------------------------------------------------------ the probing loop
class Script:
    """Scripted probes on a fake clock: each probe takes ``elapsed`` of its result, each pause what it is given."""

    def __init__(self, results: list[ProbeResult]) -> None:
        self.results = results
        self.now = 1000.0
        self.probes = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def probe(self) -> ProbeResult:
        result = self.results[min(self.probes, len(self.results) - 1)]
        self.probes += 1
        self.now += max(result.elapsed, 0.001)
        return result


def _host_gone(script: Script, *, end_in: float = 60.0) -> RankLostError | None:
    return host_gone(
        MASTER,
        claimant="host-a pid 4242",
        generation=0,
        since=script.now,
        end=script.now + end_in,
        sleep=script.sleep,
        probe_port=script.probe,
        clock=script.clock,
    )


@pytest.mark.parametrize(
    "first",
    [RESET, EOF, SILENT, REFUSED],
    ids=["dying-listener-resets", "dying-listener-eof", "dying-listener-silent", "refused"],
)
def test_rank_0_is_named_whatever_the_first_probe_meets(first: ProbeResult) -> None:
    """The flake: a first probe met by the dying listener ended the decision; now it is one sign among others."""
    script = Script([first, first, REFUSED])
    start = script.now
    error = _host_gone(script)
    assert isinstance(error, RankLostError), error
    assert error.ranks == (0,)
    assert error.claimants == ("host-a pid 4242",)
    assert "rank 0 (host-a pid 4242) joined rendezvous 127.0.0.1:29500 (generation 0)" in str(error)
    took = script.now - start
    assert STALE <= took <= STALE + PROBE_EVERY + SILENT.elapsed, took


def test_a_restarted_rank_0_lets_the_attempts_go_on() -> None:
    script = Script([REFUSED] * 8 + [STORE])
    assert _host_gone(script) is None
    assert script.probes == 9


def test_a_network_failure_lets_the_attempts_name_it() -> None:
    script = Script([RESET, BLACK_HOLE])
    assert _host_gone(script) is None
    assert script.probes == 2


def test_a_frozen_host_is_not_named() -> None:
    """TCP up, no answer all along (SIGSTOP): not a departure; the attempts and the deadline handle it."""
    script = Script([SILENT])
    start = script.now
    assert _host_gone(script) is None
    assert script.now - start < STALE + SILENT.elapsed + PROBE_EVERY + 0.01


def test_no_probe_without_room_before_the_deadline_and_none_past_it() -> None:
    script = Script([REFUSED])
    assert _host_gone(script, end_in=STALE - 0.1) is None
    assert script.probes == 0
    script = Script([REFUSED, SILENT])  # absent once, then unclear for ever: probed until the deadline only
    start = script.now
    assert _host_gone(script, end_in=20.0) is None
    assert 20.0 - SILENT.elapsed - PROBE_EVERY <= script.now - start <= 20.0 + SILENT.elapsed


# ------------------------------------------------------------------------------- who rank 0 is, and when
def _protocol(store: Store, rank: int) -> JoinProtocol:
    return JoinProtocol(
        store,
        namespace="t/",
        rank=rank,
        world_size=3,
        master="m:1",
        hosting=rank == 0,
        claimant=Claimant(host="sim", pid=10_000 + rank, nonce=f"n{rank}"),
    )


def test_a_rank_that_joins_after_rank_0_knows_it_before_its_first_beat() -> None:
    """Nothing left to the heartbeat thread's first watch (one beat later, or more on a loaded host)."""
    store = cast(Store, HashStore())
    host, rank1 = _protocol(store, 0), _protocol(store, 1)
    try:
        host.enter(0)
        rank1.enter(0)
        assert store.check(["t/g0/beat/1"])  # seen joined: it knows rank 0 already
        assert rank1.host_claimant == "sim pid 10000"
    finally:
        host.stop_beating()
        rank1.stop_beating()


def test_a_rank_that_joined_first_learns_rank_0_while_it_waits() -> None:
    store = cast(Store, HashStore())
    host, rank1 = _protocol(store, 0), _protocol(store, 1)
    try:
        rank1.enter(0)
        rank1.stop_beating()  # no heartbeat thread: only the waiting thread can learn who rank 0 is
        assert rank1.host_claimant is None
        host.enter(0)
        with pytest.raises(AttemptFailed):  # rank 2 never comes; the wait looks again within one beat
            rank1.wait(0, rank1.pace.beat + 0.3)
        assert rank1.host_claimant == "sim pid 10000"
    finally:
        host.stop_beating()


# --------------------------------------------------------- what the join says when the store fails
@contextlib.contextmanager
def _joined(*ranks: int) -> Iterator[tuple[Store, list[JoinProtocol]]]:
    """``ranks`` of a world of 3 entered generation 0 of one in-process store, in that order."""
    store = cast(Store, HashStore())
    joins = [_protocol(store, rank) for rank in ranks]
    try:
        for join in joins:
            join.enter(0)
        yield store, joins
    finally:
        for join in joins:
            join.stop_beating()


def test_a_store_failure_while_waiting_with_rank_0_points_at_its_host() -> None:
    with _joined(0, 1) as (_, (_, rank1)):
        assert rank1.beating
        silent = rank1.store_failed(time.monotonic())
        assert silent == HostSilent(claimant="sim pid 10000", stale=rank1.pace.stale)
        assert silent.stale >= 5.0  # the join's loss bound, which host_gone's probes are given
        assert not rank1.beating  # decided once: the join stopped beating
        assert rank1.store_failed(time.monotonic()) is None


def test_a_store_failure_after_a_freeze_past_the_loss_bound_is_about_this_rank() -> None:
    with _joined(0, 1) as (_, (_, rank1)):
        at = time.monotonic() + rank1.pace.stale + 1.0  # no beat for longer than the loss bound
        seen = rank1.store_failed(at)
        assert isinstance(seen, Frozen) and seen.claimant == "sim pid 10001" and seen.stale == rank1.pace.stale
        assert seen.frozen_for > seen.stale and not rank1.beating


def test_a_store_failure_without_rank_0_in_the_join_is_left_to_the_attempts() -> None:
    with _joined(1) as (_, (rank1,)):
        rank1.stop_beating()  # no heartbeat thread: it cannot learn of rank 0 behind this test's back
        assert rank1.store_failed(time.monotonic()) is None  # not beating
    with _joined(2, 1) as (_, (_, rank1)):
        assert rank1.host_claimant is None
        assert rank1.store_failed(time.monotonic()) is None and rank1.beating  # no rank 0 to name: beats on


def test_the_join_spells_its_keys_for_the_attempts() -> None:
    with _joined(0, 1) as (store, (host, rank1)):
        assert rank1.claimed(0, 0) and rank1.claimed(0, 1) and not rank1.claimed(0, 2) and not rank1.claimed(1, 0)
        assert not rank1.wait_for_state(0, time.monotonic() + 0.05)  # rank 2 is missing
        rank2 = _protocol(store, 2)
        rank2.enter(0)  # the last rank sets the state
        assert rank1.wait_for_state(0, time.monotonic() + 5.0)
        assert host.init_verdict_key(0) == "t/g0/init_verdict" and host.prefix(0) == "t/g0/pg"


def test_a_freeze_is_counted_up_to_the_store_failure_not_to_the_decision() -> None:
    """The beats that could not be written after the store failed are no freeze of this process."""
    heartbeat = Heartbeat(cast(Store, HashStore()), keys=Keys("t/"), rank=1, lost=lambda silent: None)
    heartbeat.beat()
    assert heartbeat.frozen_for(at=heartbeat.last_beat + 1.0) is None
    frozen = heartbeat.frozen_for(at=heartbeat.last_beat + STALE + 1.0)
    assert frozen == pytest.approx(STALE + 1.0)
    time.sleep(0.01)
    assert heartbeat.frozen_for() is None


def test_a_reset_as_the_connection_is_made_is_absent() -> None:
    """The listener's reset can beat the probe's connect() to its result: the connect fails with ECONNRESET
    (157 of 200 probes of an idle 2-core machine); the same drop as a reset during the handshake."""
    assert store_sign("error", "connect failed: [Errno 104] Connection reset by peer") == "absent"
    assert store_sign("error", "connect failed: [Errno 22] Invalid argument") == "unclear"
