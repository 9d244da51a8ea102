"""``setup(on_hang="abort")`` under torchrun: every rank exits within 2 s of the verdict, the culprit first, so that
torchrun's Root Cause is the culprit (issue 32). Real torchrun, four gloo workers, rank 2 in its own code."""

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

from distinit.hang import HANG_EXIT_CODE

WORKER = Path(__file__).with_name("_hang_worker.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


@pytest.mark.timeout(240)
@pytest.mark.skipif(not TORCHRUN.exists(), reason="needs torchrun beside this Python")
def test_abort_under_torchrun_stops_every_rank_and_the_culprit_is_the_root_cause(tmp_path: Path) -> None:
    spec = {"dir": str(tmp_path), "mode": "sleep", "culprit": 2, "hold": 120, "hang_after": 5, "on_hang": "abort"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    env.update(DISTINIT_VERDICT_FILE=str(tmp_path / "verdicts.jsonl"), TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node=4", "--max-restarts=0", "--monitor-interval=0.1"]
    with (tmp_path / "torchrun.log").open("wb") as log:
        proc = subprocess.Popen(
            [*command, str(WORKER), json.dumps(spec)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        end = time.monotonic() + 150
        while not all((tmp_path / f"ready{r}").exists() for r in range(4)):
            assert time.monotonic() < end and proc.poll() is None, (tmp_path / "torchrun.log").read_text()
            time.sleep(0.05)
        pids = {r: int((tmp_path / f"ready{r}").read_text()) for r in range(4)}
        (tmp_path / "go").touch()
        gone: dict[int, float] = {}  # rank -> when its process was first seen gone (or a zombie)
        end = time.monotonic() + 90
        while len(gone) < 4 and time.monotonic() < end:
            for rank, pid in pids.items():
                if rank not in gone and _gone(pid):
                    gone[rank] = time.time()
            time.sleep(0.01)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # torchrun stops its workers, then itself
            proc.wait(timeout=30)
    out = (tmp_path / "torchrun.log").read_text(errors="replace")
    records = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], records
    assert {r["culprits"] == [2] and r["kind"] == "culprit" for r in records} == {True}, records
    published = records[0]["published"]
    late = {r: round(at - published, 2) for r, at in gone.items()}
    assert sorted(late) == [0, 1, 2, 3] and all(t <= 2.0 for t in late.values()), late
    assert gone[2] == min(gone.values()), late  # the culprit first
    assert all((tmp_path / f"abort{r}.json").exists() for r in range(4)), late  # each said why
    root = out[out.index("Root Cause") :]
    assert re.search(r"rank\s*:\s*2 \(local_rank: 2\)", root) and f"exitcode  : {HANG_EXIT_CODE}" in root, out
    for rank in range(4):
        log = (tmp_path / f"debug{rank}.log").read_text()
        assert "is in load_batch at" in log and "on_hang='abort': exiting with code 75: hang: ranks 0,1,3" in log, log
