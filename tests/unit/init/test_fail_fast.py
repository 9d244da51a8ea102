"""Pure tests of the fail-fast diagnoses: lost ranks (heartbeat), oversized WORLD_SIZE, MASTER_ADDR mistakes,
and the one readable error at the public boundary.

The hosting check against this host's real sockets is in ``tests/integration/init/test_fail_fast_socket.py``.
"""

from __future__ import annotations

import math
import pickle
import threading
import time

import pytest
from torch.distributed import HashStore

from distinit.errors import IncompleteEnvError, MalformedEnvError, PortInUseError, RankLostError, RendezvousError
from distinit.init import _loopback, _messages
from distinit.init._heartbeat import Heartbeat, Silent
from distinit.init._join import Keys
from distinit.init._policy import AttemptFailed
from distinit.init._report import AttemptRecord, InitReport
from distinit.init._setup import readable


def test_rank_lost_verdict_travels_the_store_and_names_the_rank() -> None:
    exc = _messages.rank_lost(
        rank=1,
        claimant="gpu-b pid 902",
        silent_for=5.4,
        last_seen="17:12:03 UTC",
        master="10.0.0.1:29500",
        generation=0,
        local_rank=0,
    )
    again = _messages.verdict_from_json(_messages.verdict_to_json(exc), rank=2)
    assert isinstance(again, RankLostError) and isinstance(again, RendezvousError)
    assert again.ranks == (1,) and again.claimants == ("gpu-b pid 902",) and again.rank == 2
    assert "rank 1 (gpu-b pid 902) joined rendezvous 10.0.0.1:29500" in str(again)
    assert "last seen 17:12:03 UTC" in str(again) and again.why and again.fix
    assert pickle.loads(pickle.dumps(again)).ranks == (1,)


def _joined(store: HashStore, prefix: str, rank: int, position: int) -> None:
    store.set(f"{prefix}beat/{rank}", "1|0")
    store.add(f"{prefix}joined", 1)
    store.set(f"{prefix}order/{position}", str(rank))


@pytest.mark.timeout(20)
def test_watcher_names_the_joined_rank_that_stopped_beating_and_not_the_live_one() -> None:
    store, prefix = HashStore(), "ns/g0/"
    lost: list[Silent] = []
    done = threading.Event()

    def on_lost(silent: Silent) -> None:
        lost.append(silent)
        done.set()

    _joined(store, prefix, 0, 1)
    _joined(store, prefix, 1, 2)  # beats once, then never again
    _joined(store, prefix, 2, 3)
    live = Heartbeat(store, keys=Keys(prefix), rank=2, lost=lambda s: None, beat=0.05, stale=0.4)
    watcher = Heartbeat(store, keys=Keys(prefix), rank=0, lost=on_lost, beat=0.05, stale=0.4)
    live.start()
    started = time.monotonic()
    watcher.start()
    try:
        assert done.wait(10)
    finally:
        live.stop()
        watcher.stop()
    assert [s.rank for s in lost] == [1]
    assert 0.4 <= time.monotonic() - started < 5
    assert lost[0].silent_for > 0.4 and lost[0].last_seen() == "00:00:00 UTC"


@pytest.mark.timeout(20)
def test_stopped_heartbeat_stops_beating() -> None:
    store, prefix = HashStore(), "ns/g0/"
    beat = Heartbeat(store, keys=Keys(prefix), rank=3, lost=lambda s: None, beat=0.02)
    beat.beat()
    beat.start()
    time.sleep(0.2)
    beat.stop()
    value = store.get(f"{prefix}beat/3")
    time.sleep(0.2)
    assert store.get(f"{prefix}beat/3") == value


def test_oversized_world_named_with_the_launcher_count() -> None:
    hint = _messages.oversized(world_size=4, missing=[2, 3], launched=(2, "SLURM_STEP_NUM_TASKS=2"), quiet_for=0)
    assert hint and "WORLD_SIZE=4 is larger than what the launcher started (SLURM_STEP_NUM_TASKS=2)" in hint
    quiet = _messages.oversized(world_size=4, missing=[2, 3], launched=None, quiet_for=_messages.QUIET)
    assert quiet and "may be larger" in quiet
    assert _messages.oversized(world_size=4, missing=[2, 3], launched=None, quiet_for=1.0) is None  # still arriving
    assert _messages.oversized(world_size=4, missing=[1], launched=None, quiet_for=99) is None  # a hole, not the top
    started = _messages.oversized(world_size=4, missing=[3], launched=(4, "PMI_SIZE=4"), quiet_for=0)
    assert started and "the launcher started all 4 processes (PMI_SIZE=4): ranks [3] exited or crashed" in started
    final = _messages.oversized(world_size=4, missing=[2, 3], launched=None, quiet_for=math.inf)
    assert final and "exited or crashed before joining, or WORLD_SIZE=4 may be larger" in final
    exc = _messages.rendezvous_timeout(
        rank=0, world_size=4, master="h:1", deadline=9, missing=[2, 3], attempts=["#1 join"], generation=0, hint=hint
    )
    assert "SLURM_STEP_NUM_TASKS=2" in exc.why and "set WORLD_SIZE" in exc.fix


@pytest.mark.parametrize("kind", ["init", "store", "refused", "join", None])
def test_timeout_without_missing_ranks_says_why_and_fix(kind: str | None) -> None:
    exc = _messages.rendezvous_timeout(
        rank=0, world_size=2, master="h:1", deadline=9, missing=[], attempts=["#1"], generation=0, last_kind=kind
    )
    assert exc.why and exc.fix and "see what each attempt saw" not in exc.why


def test_port_in_use_names_the_port_in_use() -> None:
    exc = _messages.port_in_use(master="h:29517", port=29517, seconds=30, holder=None, rank=0)
    assert isinstance(exc, PortInUseError)
    assert "29500" not in str(exc) and "MASTER_PORT=29517 collides" in exc.why


@pytest.mark.parametrize("addr", ["dnode[1-2]", "gpu[01,03-04]", "dnode1,dnode2"])
def test_hostlist_master_addr_refused_at_once(addr: str) -> None:
    with pytest.raises(MalformedEnvError, match="is a list of hosts") as info:
        _loopback.check_master(master_addr=addr, master_port=29500, world_size=2, rank=1)
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in info.value.fix


@pytest.mark.parametrize("addr", ["node1", "10.0.0.1", "[::1]", "::1", "gpu-01.cluster.local"])
def test_single_host_master_addr_accepted(addr: str) -> None:
    _loopback.check_master(master_addr=addr, master_port=29500, world_size=2, rank=1)


def test_incomplete_env_fix_in_the_launchers_own_way() -> None:
    with pytest.raises(IncompleteEnvError, match="MASTER_ADDR") as info:
        _loopback.check_master(master_addr=None, master_port=29500, world_size=2, rank=1, launcher="openmpi")
    assert "mpirun -x MASTER_ADDR=" in info.value.fix and "export" not in info.value.fix


def test_readable_error_keeps_the_foreign_cause_and_drops_the_chain() -> None:
    def raise_chain() -> None:
        try:
            try:
                raise OSError("socket trouble")
            except OSError as exc:
                raise AttemptFailed("store", "lost") from exc
        except AttemptFailed as failed:
            raise RendezvousError("what", why="w", fix="f") from failed

    with pytest.raises(RendezvousError) as info:
        raise_chain()
    exc = readable(info.value)
    assert isinstance(exc.cause, OSError) and exc.__traceback__ is None


def test_single_process_report_has_no_none_endpoint() -> None:
    record = AttemptRecord(number=1, generation=0, phase="done", elapsed=0.0, started_at=0.0)
    report = InitReport(backend="gloo", rank=0, world_size=1, store="hosted", attempts=(record,), elapsed=0.01)
    assert "None" not in str(report) and "alone" in str(report)
