"""Rank 0's lines as the checks complete (``on_check``), other ranks' silence, the opt-in ``nccl`` check: run for real.

Each test binds a socket for a free port (``world_of_one``); most then let the doctor form a one-rank gloo world
on it, and one runs ``python -m distinit.doctor`` in fresh processes. The pure ``nccl`` decisions are in
``tests/unit/doctor/test_doctor_progress.py``.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from distinit.doctor import Check, run
from distinit.doctor._cli import Progress, output
from distinit.doctor._model import LOCAL_IDS


def world_of_one() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PATH": "/usr/bin:/bin",
    }


@pytest.mark.timeout(60)
def test_rank_zero_hears_each_check_as_it_completes_in_order() -> None:
    """Local verdicts arrive before the group exists, world verdicts while it does; then the report."""
    heard: list[tuple[str, bool]] = []

    def on_check(check: Check) -> None:
        heard.append((check.id, dist.is_initialized()))

    report = run(timeout=30, nccl=True, environ=world_of_one(), on_check=on_check)
    assert report.ok, report
    assert heard[: len(LOCAL_IDS)] == [(i, False) for i in LOCAL_IDS]
    world = [i for i, formed in heard[len(LOCAL_IDS) :] if formed]
    assert world[0] == "world" and world[1 : 1 + len(LOCAL_IDS)] == list(LOCAL_IDS)  # merged local ones
    assert world[1 + len(LOCAL_IDS) :] == ["consensus", "nodes", "clock", "reach", "nccl"]
    assert len(heard) == len(LOCAL_IDS) + len(world)  # nothing after the group was left
    assert not dist.is_initialized()
    assert sorted(c.id for c in report.checks) == sorted({i for i, _ in heard})


@pytest.mark.timeout(60)
def test_progress_prints_one_line_per_check_then_only_fixes_and_verdict() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    report = run(timeout=30, environ=world_of_one(), on_check=progress, skip=["clock"])
    lines = stream.getvalue().splitlines()
    assert lines[0] == "distinit doctor: local checks of this rank"
    assert lines[1].split()[:2] == ["pass", "env"]
    assert [line.split()[1] for line in lines[1 : 1 + len(LOCAL_IDS)]] == list(LOCAL_IDS)
    heading = lines.index(next(line for line in lines if line.startswith("distinit doctor: the world")))
    assert lines[heading + 1].split()[:2] == ["pass", "world"]
    assert [line.split()[:2] for line in lines if " clock " in line] == [["skip", "clock"]]
    assert progress.lines == len(lines) - 2  # two headings
    end = output(report, as_json=False, streamed=True)
    assert end.splitlines()[-1].startswith("verdict: ok") and "  pass  " not in end


def test_other_ranks_stream_nothing_and_an_unresolved_rank_reports_itself() -> None:
    heard: list[Check] = []
    environ = {**world_of_one(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    report = run(timeout=10, environ=environ, on_check=heard.append, skip=["world"])
    assert heard == [] and report.rank == 1
    unresolved = run(timeout=10, environ={"RANK": "1"}, on_check=heard.append)
    assert heard and heard[0].id == "env" and heard[0].status == "fail"  # no rank known: it reports itself
    assert unresolved.exit_status == 2


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: this machine has CUDA")
def test_nccl_on_a_cpu_machine_is_skip_with_the_reason() -> None:
    report = run(timeout=30, nccl=True, environ=world_of_one())
    found = report.check("nccl")
    assert found.status == "skip" and "torch.cuda.is_available() is False" in found.summary
    assert report.ok
    assert "nccl" not in [c.id for c in run(timeout=30, environ=world_of_one()).checks]  # opt-in only


@pytest.mark.timeout(120)  # two doctor runs, each bounded at 50 s below: the test's bound must hold both
def test_json_is_one_document_and_human_output_streams_then_ends_with_the_verdict() -> None:
    def doctor(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "distinit.doctor", "--timeout", "20", *args],
            env={**world_of_one(), "PYTHONWARNINGS": "ignore"},
            capture_output=True,
            text=True,
            timeout=50,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()

    (only,) = doctor("--json")
    assert json.loads(only)["ok"] is True
    lines = doctor()
    assert lines[0] == "distinit doctor: local checks of this rank" and lines[-1].startswith("verdict: ok in ")
    assert sum(line.startswith("distinit doctor: the world") for line in lines) == 1
