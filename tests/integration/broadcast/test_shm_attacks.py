"""Issue 23 items 1, 3, 4: a same-uid attacker against ``via="shm"``, and a whole job SIGKILLed mid-write.

The attacker is its own process (``shm_attacker.py``); src is paused at the step attacked (between its
first write and the seal, or right after the seal) through marker files, never by sleeping. Every case
asserts that the attack fails or is named, on every rank, within the call's timeout, and that nothing is
left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from via_launch import Job, segments

ATTACKER = Path(__file__).with_name("shm_attacker.py")
TIMEOUT = 60  # the ranks' timeout=: generous, the attacker runs beside them on a loaded machine


def _attack(tmp_path: Path, mode: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    meet = tmp_path / "meet"
    meet.mkdir()
    attacker = subprocess.Popen([sys.executable, str(ATTACKER), mode, str(meet)])
    try:
        deadline = time.monotonic() + 60
        while not (meet / "attacker-ready").exists():  # its inotify watch is set before the job starts
            assert time.monotonic() < deadline and attacker.poll() is None, "the attacker did not start"
            time.sleep(0.01)
        env = {"VIA_MEET": str(meet), "VIA_TIMEOUT": str(TIMEOUT), "DISTINIT_TEST_FAULT": f"attack-{mode}"}
        job = Job(tmp_path, "attack", [(range(3), None)], env=env)
        results = job.results(timeout=150)
        assert attacker.wait(timeout=60) == 0
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait(timeout=10)
    return results, json.loads((meet / "attacker.json").read_text())


@pytest.mark.timeout(200)
def test_writes_before_the_seal_are_caught_by_every_rank(tmp_path: Path) -> None:
    """The attacker reopens the leader's segment through /proc and overwrites bytes src already wrote.

    The leader compares the sealed segment with what it wrote before any reader opens it: the change is
    named on every rank.
    """
    before = segments()
    results, attacker = _attack(tmp_path, "before-seal")
    assert attacker["outcomes"] == {"fchmod": "ok", "pwrite": "ok"}, attacker  # the attack itself succeeded
    assert {r.get("error") for r in results} == {"BroadcastMismatchError"}, results
    assert {r["field"] for r in results} == {"payload"}
    assert len({r["text"] for r in results}) == 1 and "other bytes" in results[0]["text"], results[0]
    assert all(r["ranks"] == [0] for r in results)  # the leader compared its sealed segment and named itself
    assert all(r["elapsed"] < TIMEOUT for r in results), results
    assert attacker["created in /dev/shm"] == [] and segments() == before


@pytest.mark.timeout(200)
def test_after_the_seal_nobody_can_change_shrink_or_map_the_segment(tmp_path: Path) -> None:
    """Sealed: writes, truncation and writable shared maps are refused, before and after the call returned.

    Rank 1 keeps zero-copy views; it reads every byte after the attacker tried to truncate the segment
    through a descriptor opened before the seal (a truncation would kill it with SIGBUS).
    """
    before = segments()
    results, attacker = _attack(tmp_path, "after-seal")
    outcomes = attacker["outcomes"]
    assert outcomes.pop("fchmod after seal") == "ok", outcomes  # the owner may: so the reopen is writable
    for step in ("pwrite after seal", "ftruncate after seal", "mmap shared after seal"):
        assert outcomes.pop(step) == "EPERM", (step, attacker)
    assert len(outcomes) == 4 and "ok" not in outcomes.values(), outcomes  # both descriptors, after return
    for rank, result in enumerate(results):
        assert result.get("equal") is True, (rank, result)
    assert results[1]["equal after"] and results[2]["equal after"], results
    assert attacker["created in /dev/shm"] == [] and segments() == before


@pytest.mark.timeout(200)
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a private /dev/shm"
)
def test_a_job_killed_while_writing_leaves_nothing(tmp_path: Path) -> None:
    """Every rank SIGKILLed while src writes 64 MiB, in a private /dev/shm: nothing is left there.

    The ranks share a private mount namespace; after they die, a shell in that namespace lists its
    /dev/shm and runs the doctor's stale-segment scan.
    """
    meet = tmp_path / "meet"
    meet.mkdir()
    scan = tmp_path / "scan.py"
    scan.write_text("from distinit.doctor._shm import stale_files\nprint(stale_files())\n")
    after = f"ls -A /dev/shm > {meet}/listing; {sys.executable} {scan} > {meet}/stale"  # no quotes: fake_host's
    env = {"VIA_MEET": str(meet), "VIA_TIMEOUT": str(TIMEOUT), "VIA_NBYTES": str(64 << 20),
           "DISTINIT_TEST_FAULT": "kill-while-writing"}  # fmt: skip
    job = Job(tmp_path, "one-tensor", [(range(3), "256m")], env=env, after=after)
    try:
        deadline = time.monotonic() + 120
        while not (meet / "writing").exists():
            assert time.monotonic() < deadline, job.logs()
            time.sleep(0.01)
        pids = [int((meet / f"pid-{rank}").read_text()) for rank in range(3)]
        src = pids[0]
        assert any(os.readlink(f"/proc/{src}/fd/{fd}").startswith("/memfd:distinit-bc-")
                   for fd in os.listdir(f"/proc/{src}/fd")), "src holds no segment while writing"  # fmt: skip
        for pid in pids:  # the ranks this test started (through the job's shell), by pid
            os.kill(pid, signal.SIGKILL)
        results = job.results(timeout=60)
    finally:
        job.stop()
    assert all(r == {"exit": "no result"} for r in results), results
    assert (meet / "listing").read_text().split() == []
    assert (meet / "stale").read_text().strip() == "[]"


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop CAP_SYS_PTRACE")
def test_a_leader_readers_cannot_reach_through_proc_is_named_on_every_rank(tmp_path: Path) -> None:
    # /proc/<leader>/fd unreadable (hidepid, a non-dumpable leader, no CAP_SYS_PTRACE): the readers cannot
    # open the segment; every rank raises the same named error at once, and nothing is left behind.
    drop = ["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"]
    worker = [*drop, sys.executable, str(Path(__file__).with_name("via_worker.py")), "one-tensor"]
    env = {"DISTINIT_TEST_FAULT": "non-dumpable-leader", "VIA_TIMEOUT": "60"}
    results = Job(tmp_path, "one-tensor", [(range(3), None)], env=env, command=worker).results(timeout=100)
    assert [r.get("error") for r in results] == ["BroadcastMismatchError"] * 3, results
    assert all(r["ranks"] == [1, 2] and "EACCES" in r["text"] and r["elapsed"] < 30 for r in results), results
    assert segments() == []
