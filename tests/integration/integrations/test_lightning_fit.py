"""A real Lightning ``Trainer.fit`` under real ``mpirun`` with DistinitEnvironment (issue 13, item 3).

Without the plugin, plain Lightning under ``mpirun -n 2`` sees no ``LOCAL_RANK`` and starts processes of
its own in every rank; with it, Lightning trains as the ranks mpirun started, and its ``global_rank``
equals torch's on every rank.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

MPIRUN = shutil.which("mpirun.openmpi")
WORKER = Path(__file__).with_name("lightning_fit.py")
#: Launcher and torch variables of whatever runs the tests, kept away from the launched ranks.
INHERITED = ("OMPI_", "PMI", "PMIX_", "SLURM_", "TORCHELASTIC_", "MASTER_", "RANK", "LOCAL_", "WORLD_SIZE", "NODE_RANK")


@pytest.mark.timeout(120)
@pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun.openmpi is not installed")
def test_fit_under_mpirun_trains_as_the_launchers_ranks(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED) and k != "GROUP_RANK"}
    environ["OMP_NUM_THREADS"] = "1"
    argv = [str(MPIRUN), "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, str(WORKER)]
    argv.append(str(tmp_path))
    proc = subprocess.Popen(
        argv, env=environ, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"Trainer.fit under mpirun did not finish within 90 s:\n{output.decode(errors='replace')[-4000:]}")
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    records = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank-*.json"))]
    assert [r["torch_rank"] for r in records] == [0, 1], text[-4000:]
    for record in records:
        assert record["lightning_global_rank"] == record["torch_rank"], record
        assert (record["lightning_world_size"], record["torch_world_size"]) == (2, 2), record
        assert record["lightning_node_rank"] == 0
        assert record["steps"] == 3
