"""``via="shm"`` and ``via="auto"`` on real gloo groups, real processes and real /dev/shm.

Fake hosts are private mount namespaces with a /dev/shm tmpfs of their own (another device, so another
host to distinit); the small-/dev/shm and killed-receiver cases are real faults, not mocks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from via_launch import PID_NAMESPACE, Job, free_port, segments

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for private /dev/shm mounts"
)


def _events(result: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [e for e in result.get("events", []) if e.get("event") == event]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 4])
def test_shm_round_trips_on_one_host(tmp_path: Path, world: int) -> None:
    before = segments()
    results = Job(tmp_path, "roundtrip-shm", [(range(world), None)]).results(timeout=200)
    for rank, result in enumerate(results):
        assert result.get("checks") and all(result["checks"].values()), (rank, result)
    assert segments() == before


@pytest.mark.timeout(180)
def test_auto_round_trips(tmp_path: Path) -> None:
    results = Job(tmp_path, "roundtrip-auto", [(range(3), None)]).results(timeout=150)
    assert all(r.get("checks") and all(r["checks"].values()) for r in results), results


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("world", "route"), [(4, "shm"), (2, "network")])
def test_auto_takes_shm_only_where_it_measured_faster(tmp_path: Path, world: int, route: str) -> None:
    results = Job(tmp_path, "auto-views", [(range(world), None)]).results(timeout=120)
    for result in results:
        assert result.get("equal") is True, result
        (event,) = _events(result, "broadcast.route")
        assert event["route"] == route, event


@pytest.mark.timeout(240)
def test_shm_round_trips_on_the_digest_path_of_large_groups(tmp_path: Path) -> None:
    """Groups from DISTINIT_BROADCAST_DIGEST_FROM ranks agree on the header by digest: via must still work."""
    env = {"DISTINIT_BROADCAST_DIGEST_FROM": "2"}
    results = Job(tmp_path, "roundtrip-shm", [(range(3), None)], env=env).results(timeout=200)
    for rank, result in enumerate(results):
        assert result.get("checks") and all(result["checks"].values()), (rank, result)


@pytest.mark.timeout(120)
def test_two_fake_hosts_take_the_hierarchical_path(tmp_path: Path) -> None:
    """Ranks 0,1 on this host, ranks 2,3 on a fake host: one network hop between leaders, shm inside each."""
    results = Job(tmp_path, "one-tensor", [((0, 1), None), ((2, 3), "64m")]).results(timeout=100)
    for rank, result in enumerate(results):
        assert result.get("equal") is True, (rank, result)
        (route,) = _events(result, "broadcast.route")
        assert route["route"] == "shm" and route["hosts"] == [[0, 1], [2, 3]], route
    assert segments() == []


@pytest.mark.timeout(120)
def test_ranks_not_co_located_fall_back_with_a_note(tmp_path: Path) -> None:
    results = Job(tmp_path, "one-tensor", [((0,), None), ((1,), "64m")]).results(timeout=100)
    for result in results:
        assert result.get("equal") is True, result
        (note,) = _events(result, "broadcast.via_fallback")
        assert note["level"] == "WARNING" and "share a host" in str(note["reason"]), note


@pytest.mark.timeout(120)
def test_ranks_in_another_pid_namespace_are_another_host(tmp_path: Path) -> None:
    """Same /dev/shm, other pid namespace (containers with --ipc=host): /proc cannot name the leader's segment.

    Ranks 0 and 1 here, rank 2 in a private pid namespace: shm inside {0, 1}, the network to rank 2.
    """
    results = Job(tmp_path, "one-tensor", [((0, 1), None), ((2,), PID_NAMESPACE)]).results(timeout=100)
    for rank, result in enumerate(results):
        assert result.get("equal") is True, (rank, result)
        (route,) = _events(result, "broadcast.route")
        assert route["route"] == "shm" and route["hosts"] == [[0, 1], [2]], route


@pytest.mark.timeout(120)
def test_small_dev_shm_falls_back_with_a_note(tmp_path: Path) -> None:
    """Every rank in one namespace whose /dev/shm holds 1 MiB; the payload is 3 MiB."""
    results = Job(tmp_path, "one-tensor", [((0, 1, 2), "1m")]).results(timeout=100)
    for result in results:
        assert result.get("equal") is True, result
        (note,) = _events(result, "broadcast.via_fallback")
        assert note["level"] == "WARNING" and "bytes free" in str(note["reason"]), note


@pytest.mark.timeout(120)
def test_killed_receiver_leaves_no_segment_and_a_named_error(tmp_path: Path) -> None:
    before = segments()
    job = Job(tmp_path, "kill", [(range(3), None)], env={"DISTINIT_TEST_FAULT": "kill-after-attach"})
    results = job.results(timeout=100)
    assert results[1] == {"exit": "no result"}  # SIGKILLed after mapping the segment
    for rank in (0, 2):
        assert results[rank].get("error") == "BroadcastTimeoutError", (rank, results[rank], job.logs())
        assert results[rank]["elapsed"] < 20 + 15, results[rank]  # within its timeout= (20 s), with slack
        assert results[rank]["segments_after"] == [], results[rank]
    assert segments() == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("digest_from", [None, "2"], ids=["rows", "digest"])
def test_ranks_disagreeing_on_via_fail_alike(tmp_path: Path, digest_from: str | None) -> None:
    # On the digest path of large groups the via bits are part of the digest: a difference falls back to
    # the rows, so every rank names the same rank too.
    env = {"DISTINIT_BROADCAST_DIGEST_FROM": digest_from} if digest_from else None
    results = Job(tmp_path, "mismatch", [(range(3), None)], env=env).results(timeout=100)
    assert {r.get("error") for r in results} == {"BroadcastMismatchError"}, results
    assert {r["field"] for r in results} == {"transport"}
    assert len({r["text"] for r in results}) == 1 and all(r["ranks"] == [2] for r in results)


@pytest.mark.timeout(180)
def test_concurrent_jobs_keep_their_own_segments(tmp_path: Path) -> None:
    """Two jobs on one host at once, 32 MiB each, different data: each gets exactly its own."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    big = str(32 << 20)
    a = Job(tmp_path / "a", "one-tensor", [(range(2), None)], env={"VIA_SEED": "1", "VIA_NBYTES": big})
    b = Job(tmp_path / "b", "one-tensor", [(range(2), None)], env={"VIA_SEED": "2", "VIA_NBYTES": big})
    for result in [*a.results(timeout=150), *b.results(timeout=150)]:
        assert result.get("equal") is True, result
    assert segments() == []


@pytest.mark.timeout(180)
def test_shm_under_torchrun(tmp_path: Path) -> None:
    """Three ranks started by torchrun (its own LOCAL_* variables, which distinit does not use to decide)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    worker = str(Path(__file__).with_name("via_worker.py"))
    cmd = [str(torchrun), "--nproc-per-node", "3", "--master-port", str(free_port()), worker, "roundtrip-shm"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR")}
    done = subprocess.run(cmd, env={**env, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True, timeout=150)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and len(results) == 3, done.stderr[-3000:]
    assert all("false" not in line for line in results), results
    assert segments() == []
