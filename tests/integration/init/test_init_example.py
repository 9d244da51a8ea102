"""examples/train.py (the one-call setup()) runs for real under torchrun, mpirun and srun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from init_launch import free_port

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "train.py"
BIN = Path(sys.executable).parent


def _clean_env() -> dict[str, str]:
    prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "MPI_")
    names = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes) and k not in names}
    env.update(PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    return env


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout[-3000:]
    data: dict[str, Any] = json.loads(lines[0])
    return data


@pytest.mark.timeout(120)
def test_example_under_torchrun() -> None:
    done = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--steps", "3"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    summary = _summary(done)
    assert summary["launcher"] == "torchrun" and summary["world_size"] == 2
    assert summary["store"] == "agent"  # torchrun's store is used, no second one is hosted


@pytest.mark.timeout(120)
def test_example_under_mpirun() -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed")
    cmd = [mpirun, "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    for name in ("PYTHONWARNINGS", "PATH"):
        cmd += ["-x", name]
    done = subprocess.run(
        [*cmd, sys.executable, str(EXAMPLE), "--steps", "3"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    summary = _summary(done)
    assert summary["launcher"] == "openmpi" and summary["world_size"] == 2
    assert summary["store"] == "hosted"


@pytest.mark.timeout(180)
def test_example_under_srun(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts" / "launchers"))
    try:
        import cluster
    except ImportError as exc:
        pytest.skip(f"the emulated Slurm cluster helper is not available: {exc}")
    finally:
        sys.path.pop(0)
    if os.geteuid() != 0 or cluster.missing_binaries():
        pytest.skip("the emulated Slurm cluster needs root and Slurm/munge installed (`make system`)")
    started = cluster.start(tmp_path / "slurm", owner=os.getpid())
    try:
        done = subprocess.run(
            ["srun", "-K1", "-N2", "-n2", "-w", "dnode[1-2]", sys.executable, str(EXAMPLE), "--steps", "3"],
            env=started.client_env(_clean_env()),
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
    finally:
        cluster.stop(tmp_path / "slurm")
    summary = _summary(done)
    assert summary["launcher"] == "slurm" and summary["world_size"] == 2
