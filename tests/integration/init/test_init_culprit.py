"""After setup(): every survivor names the rank that stopped first, within 6 s, and never a live rank.

World 4 on two emulated hosts (each rank in a UTS namespace of its own: ranks 0 and 1 on ``hosta``, 2 and 3 on
``hostb``, so a rank sees the pids of its own host's ranks only, as on real machines). One rank is SIGKILLed
right after setup() or while every rank loops all_reduce; the store host (rank 0), a rank beside it and a rank
on the other host each take a turn. A rank that raises its own exception is named with it, and the ranks
that leave because their collective failed are consequences, never the culprit. Real processes, real gloo.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from init_launch import free_port
from init_launch import uts_reason as _uts_available
from tests._zygote import popen

WORKER = Path(__file__).with_name("_after_setup_worker.py")
HOSTS = ("hosta", "hosta", "hostb", "hostb")
WORLD = len(HOSTS)
#: The issue's bound: the name comes within 6 s of the loss at world <= 64.
NAMED_WITHIN = 6.0


_REASON = _uts_available()
pytestmark = [pytest.mark.skipif(_REASON is not None, reason=_REASON or ""), pytest.mark.timeout(240)]


def _start(rank: int, port: int, where: Path, hosts: tuple[str, ...], **spec: object) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank % 2),
        LOCAL_WORLD_SIZE="2",
        NODE_RANK=str(rank // 2),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCH_CPP_LOG_LEVEL="ERROR",
        OMP_NUM_THREADS="1",
    )
    command = [sys.executable, str(WORKER), json.dumps({"dir": str(where), **spec})]
    with (where / f"rank{rank}.log").open("wb") as log:  # a UTS namespace of its own; the pid is the rank's
        return popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, hostname=hosts[rank])


def _wait_files(where: Path, name: str, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not all((where / f"{name}{r}").exists() for r in range(WORLD)):
        assert time.monotonic() < end, [p.poll() for p in procs]
        dead = [r for r, p in enumerate(procs) if p.poll() is not None]
        assert not dead, [(where / f"rank{r}.log").read_text()[-3000:] for r in dead]
        time.sleep(0.05)


def _run(
    where: Path,
    *,
    victim: int | None,
    during: bool,
    stall: tuple[int, float] | None = None,
    hosts: tuple[str, ...] = HOSTS,
    **spec: object,
) -> tuple[float, list[int]]:
    """Start the world, end ``victim`` (SIGKILL) or let ``spec`` make a rank raise; when it ended, the pids.

    ``stall``: (rank, seconds) -- that rank is stopped (SIGSTOP) just before the kill and resumed that much
    later: a live rank whose threads do not run for a while, as on a host under load.
    """
    port = free_port()
    procs = [_start(r, port, where, hosts, **spec) for r in range(WORLD)]
    try:
        _wait_files(where, "ready", procs, 150)  # four interpreters import torch on a loaded 2-core machine
        pids = [p.pid for p in procs]
        if during:
            (where / "go").touch()
            _wait_files(where, "looping", procs, 60)
        if stall is not None:
            os.kill(procs[stall[0]].pid, signal.SIGSTOP)
        killed_at = time.time()
        if victim is not None:
            os.kill(procs[victim].pid, signal.SIGKILL)
        (where / "go").touch()
        if stall is not None:
            time.sleep(stall[1])  # the fault itself: how long the rank does not run
            os.kill(procs[stall[0]].pid, signal.SIGCONT)
        for proc in procs:
            proc.wait(timeout=90)
        return killed_at, pids
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def _findings(where: Path, ranks: list[int]) -> dict[int, dict[str, object]]:
    logs = {r: (where / f"rank{r}.log").read_text()[-4000:] for r in range(WORLD)}
    missing = [r for r in ranks if not (where / f"finding{r}.json").exists()]
    assert not missing, (missing, logs)
    return {r: json.loads((where / f"finding{r}.json").read_text()) for r in ranks}


@pytest.mark.parametrize("during", [False, True], ids=["after-setup", "during-collective"])
@pytest.mark.parametrize("victim", [0, 1, 3], ids=["store-host", "beside-it", "other-host"])
def test_every_survivor_names_the_killed_rank_within_6_s(tmp_path: Path, victim: int, during: bool) -> None:
    killed_at, pids = _run(tmp_path, victim=victim, during=during)
    survivors = [r for r in range(WORLD) if r != victim]
    findings = _findings(tmp_path, survivors)
    messages = {str(f["message"]).partition("went away: ")[2] for f in findings.values()}
    for rank, finding in findings.items():
        message = str(finding["message"])
        assert f"went away: rank {victim} (host {HOSTS[victim]}, pid {pids[victim]})" in message, (rank, message)
        assert float(str(finding["at"])) - killed_at < NAMED_WITHIN, (rank, finding["at"], killed_at)
        for alive in survivors:  # a live rank may appear only as a consequence
            assert f"went away: rank {alive} " not in message, (rank, message)
    # one finding, worded alike (the store host's, published), except where the store died with its host and
    # every survivor judged alone: then each names rank 0 from what it saw itself
    if victim != 0:
        assert len(messages) == 1, messages


def test_a_live_rank_that_did_not_run_for_3_s_is_neither_named_nor_left_without_the_finding(tmp_path: Path) -> None:
    """Rank 3 (other host) is stopped for 3 s as rank 1 is killed: its beat stops for longer than two beats.

    Two missed beats alone must not decide between rank 1 (gone) and rank 3 (silent): rank 0 watches until
    rank 3 beats again, names rank 1, and keeps the store up until rank 3 read the finding. Before, rank 0 said
    "unknown" (two ranks stopped within a beat), left without waiting for rank 3, and rank 3, finding the store
    gone, named rank 0.
    """
    _, pids = _run(tmp_path, victim=1, during=False, stall=(3, 3.0))
    findings = _findings(tmp_path, [0, 2, 3])
    for rank, finding in findings.items():
        message = str(finding["message"])
        assert f"went away: rank 1 (host hosta, pid {pids[1]})" in message, (rank, message)
        assert "rank 3 (host" not in message.partition("consequences")[0], (rank, message)
    assert len({str(f["message"]).partition("went away: ")[2] for f in findings.values()}) == 1


def test_a_rank_holding_the_gil_for_10_s_after_setup_is_no_lost_rank_and_nothing_aborts(tmp_path: Path) -> None:
    """Issue 33: rank 3 (other host) holds the GIL for 10 s in one C call while the others wait in an all_reduce.

    Its beat stops for twice the loss bound, so rank 0's watch warns; but nothing is a verdict: every rank
    completes the collectives and ends normally, nobody names anybody, and the warning is withdrawn when rank 3
    beats again.
    """
    _, pids = _run(tmp_path, victim=None, during=False, mode="gil", holder=3, hold=10)
    logs = {r: (tmp_path / f"debug{r}.log").read_text() for r in range(WORLD)}
    assert all((tmp_path / f"done{r}").exists() for r in range(WORLD)), logs
    assert not list(tmp_path.glob("finding*.json")), logs
    who = f"rank 3 (host hostb, pid {pids[3]})"
    warned = re.search(f"{re.escape(who)} has not beaten for", logs[0])
    # rank 0 waits for the withdrawal before its teardown: rank 3 beats again, or its first act is its goodbye
    back = re.search(
        f"{re.escape(who)} (beats again after|left through teardown).*the warning above is withdrawn", logs[0]
    )
    assert warned is not None and back is not None and warned.start() < back.start(), logs[0]
    assert all("RankLostError" not in log and "went away" not in log for log in logs.values()), logs


def test_junk_on_the_finding_key_and_a_forged_who_key_name_nobody_wrongly(tmp_path: Path) -> None:
    """Issue 33: after setup(), junk on the ``lost`` key and rank 2's who key claiming a dead pid on rank 0's host.

    Any client of the store can write both. Rank 1 is then killed: every survivor still names rank 1, the junk
    is never printed as a finding (a warning says it was ignored), and rank 2, beating, is never "gone".
    """
    _, pids = _run(tmp_path, victim=1, during=False, mode="junk", forger=2)
    findings = _findings(tmp_path, [0, 2, 3])
    logs = "".join((tmp_path / f"debug{r}.log").read_text() for r in (0, 2, 3))
    for rank, finding in findings.items():
        message = str(finding["message"])
        assert f"went away: rank 1 (host hosta, pid {pids[1]})" in message, (rank, message)
        assert "did it" not in message and "rank 2 (host hosta, pid 4000000): its process is gone" not in message
    assert "that are no finding of distinit's" in logs, logs


def test_non_ascii_and_63_character_host_names_are_named_as_they_are(tmp_path: Path) -> None:
    """Issue 33: non-ASCII host names and ones of 63 bytes (the most torch's gloo reads: test_init_hostnames.py)."""
    hosts = ("hôte-ünï-α", "hôte-ünï-α", "b" * 63, "b" * 63)
    _, pids = _run(tmp_path, victim=1, during=False, hosts=hosts)
    for rank, finding in _findings(tmp_path, [0, 2, 3]).items():
        message = str(finding["message"])
        assert f"went away: rank 1 (host hôte-ünï-α, pid {pids[1]})" in message, (rank, message)


def test_a_rank_that_raises_is_named_with_its_exception_and_the_others_as_consequences(tmp_path: Path) -> None:
    _, pids = _run(tmp_path, victim=None, during=True, mode="raise", raiser=2)
    findings = _findings(tmp_path, [0, 1, 3])
    for rank, finding in findings.items():
        message = str(finding["message"])
        assert f"went away: rank 2 (host hostb, pid {pids[2]}): it raised ValueError: a bug" in message, (rank, message)
        assert "unknown" not in message, message
