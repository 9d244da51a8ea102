"""The multi-node recipe on the emulated Slurm cluster: one daemon per node, started by the batch script.

The emulated nodes (``slurmd -N dnodeN``) share this host's ``/dev/shm``, so each node's directory carries the
node name; on a real cluster ``/dev/shm`` is per host and one path serves every node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wd_helpers import read_events

REPO = Path(__file__).resolve().parents[3]
HUNG = 3  # on the second node

WORKER = f"""
import os, time
from distinit.watchdog import WatchdogClient

client = WatchdogClient(fail_closed=True)  # RANK unset: the ranks come from SLURM_PROCID/SLURM_LOCALID
rank = int(os.environ["SLURM_PROCID"])
with client.expires(2.0 if rank == {HUNG} else 60.0, scope="step"):
    time.sleep(600 if rank == {HUNG} else 0.5)
"""

# The recipe of docs/watchdog.md ("Multi-node jobs"), with the node name in the path (see the module docstring).
BATCH = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2
set -u
WD='{out}/wd-$SLURMD_NODENAME'
srun -N "$SLURM_JOB_NUM_NODES" -n "$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --overlap \\
    bash -c "exec {python} -m distinit.cli watchdog serve --grace 0 --path $WD --events $WD.events.jsonl" &
DAEMONS=$!
for _ in $(seq 300); do [ "$(ls {out}/wd-*/sock 2>/dev/null | wc -l)" = 2 ] && break; sleep 0.1; done
srun --ntasks-per-node=2 bash -c "DISTINIT_WATCHDOG=$WD exec {python} {out}/worker.py"
echo "workers $?" > {out}/workers.rc
ls {out}/wd-*/sock > {out}/daemons.alive
kill $DAEMONS
wait $DAEMONS
"""


def _launch_support() -> Any:
    sys.path.insert(0, str(REPO / "tests" / "integration" / "launchers"))
    import launch_support

    return launch_support


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if os.geteuid() != 0 or any(shutil.which(b) is None for b in ("srun", "sbatch")):
        pytest.skip("needs root and Slurm (scripts/install-system-deps.sh) for the emulated cluster")
    support = _launch_support()
    workdir = tmp_path_factory.mktemp("wd-slurm")
    try:
        started = support.start_cluster(workdir, nodes=2)
    except (OSError, RuntimeError) as exc:
        pytest.fail(f"could not start the emulated Slurm cluster: {exc}", pytrace=False)
    try:
        yield started
    finally:
        support.stop_cluster(workdir)


@pytest.mark.timeout(240)
def test_one_daemon_per_node_watches_its_own_ranks(slurm: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "worker.py").write_text(WORKER)
    script = out / "job.sh"
    script.write_text(BATCH.format(out=out, python=sys.executable))
    run = subprocess.run(
        ["sbatch", "--wait", "-o", str(out / "job.out"), str(script)],
        env=slurm.client_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    job_out = (out / "job.out").read_text(errors="replace") if (out / "job.out").exists() else ""
    files = sorted(out.glob("wd-*.events.jsonl"))
    assert len(files) == 2, f"{run.stdout}{run.stderr}{job_out}"
    by_node = {f.name.split(".")[0]: read_events(f) for f in files}
    registered = {
        node: sorted((e["rank"], e["local_rank"], e["world_size"]) for e in ev if e["event"] == "watchdog.registered")
        for node, ev in by_node.items()
    }
    assert sorted(registered.values()) == [[(0, 0, 4), (1, 1, 4)], [(2, 0, 4), (3, 1, 4)]], job_out
    expired = {node: [e for e in ev if e["event"] == "watchdog.expired"] for node, ev in by_node.items()}
    hung_node = next(node for node, ranks in registered.items() if (HUNG, 1, 4) in ranks)
    assert [(e["rank"], e["scope"], e["outcome"]) for e in expired[hung_node]] == [(HUNG, "step", "killed")]
    assert all(not ev for node, ev in expired.items() if node != hung_node)  # the other node's daemon: nothing
    started = [e for ev in by_node.values() for e in ev if e["event"] == "watchdog.started"]
    assert len(started) == 2, job_out  # exactly one daemon per node: no second one was even tried
    assert len((out / "daemons.alive").read_text().split()) == 2  # both still up when the workers finished
