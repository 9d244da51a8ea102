"""``validate_settings`` after ``distinit.setup()`` compares the ranks' settings in one ``all_reduce``: on a real
gloo group of two processes, a rank passing other ``devices`` is one error on both ranks, and a rank that went
away is a typed error naming it (not gloo's bare ``Connection closed by peer``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests._zygote import popen

pytest.importorskip("lightning")

WORKER = """
import json, os, sys
import distinit
from distinit.integrations.lightning import DistinitEnvironment

result = distinit.setup(backend="gloo", deadline=60)
env = DistinitEnvironment(env=result.env)
rank = result.env.rank
def attempt(step, devices):
    try:
        env.validate_settings(devices, 1)
        print(json.dumps({"step": step, "ok": True}), flush=True)
    except Exception as exc:
        print(json.dumps({"step": step, "error": type(exc).__name__, "message": str(exc)}), flush=True)
attempt("differ", 3 if rank == 1 else 2)
attempt("twice", 2)
if rank == 1:
    os._exit(0)  # gone without a word, as a rank killed between setup() and fit()
attempt("lost", 2)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(120)
def test_settings_compared_once_and_a_lost_rank_is_named(tmp_path: Path) -> None:
    port = _free_port()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = []
    for rank in range(2):
        environ = {
            k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "MASTER_"))
        }
        environ.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            popen(
                [sys.executable, str(script)], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
            )
        )
    try:
        outputs = [proc.communicate(timeout=100) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    records = [
        {r["step"]: r for r in map(json.loads, out.decode().splitlines()) if isinstance(r, dict)} for out, _ in outputs
    ]
    detail = [err.decode()[-3000:] for _, err in outputs]
    differ = [r["differ"] for r in records]
    assert [d.get("error") for d in differ] == ["ConflictingEnvError"] * 2, (differ, detail)
    assert (
        differ[0]["message"] == differ[1]["message"] and "devices=3, num_nodes=1 on ranks [1]" in differ[0]["message"]
    )
    assert [r["twice"].get("ok") for r in records] == [True, True], (records, detail)  # Lightning may call it again
    lost = records[0]["lost"]
    assert lost.get("error") == "RankLostError", (lost, detail)
    assert "rank 1" in lost["message"] and "Lightning settings" in lost["message"], lost
