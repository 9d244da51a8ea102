"""Helpers shared by the real-launcher tests and their fixtures (not a test module)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts" / "launchers"))

import cluster  # noqa: E402 - re-exported for conftest
import shapes  # noqa: E402

BINARIES = {
    "slurm": ("srun", "sbatch", "salloc", "sinfo", "slurmctld", "slurmd", "munged", "munge"),
    "openmpi": (shapes.OPENMPI, "orted"),
    "mpich": (shapes.HYDRA,),
    "torchrun": (),
}


def in_ci() -> bool:
    """True when CI=true: a launcher that cannot run is then a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def unavailable(reason: str) -> None:
    """Skip (contributors) or fail (CI) with REASON."""
    if in_ci():
        pytest.fail(f"CI=true but the launcher tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def distinit_bin() -> str:
    """The ``distinit`` console script of the interpreter running the tests (the project venv)."""
    path = Path(sys.executable).parent / "distinit"
    if not path.exists():
        pytest.fail(f"{path} is missing: install the project (make venv)", pytrace=False)
    return str(path)


def _which(name: str) -> bool:
    return shutil.which(name) is not None or Path("/usr/sbin", name).exists()


def require(needs: Sequence[str]) -> None:
    """Skip/fail unless every launcher family in NEEDS can run here."""
    for family in needs:
        missing = [b for b in BINARIES[family] if not _which(b)]
        if family == "torchrun" and not (Path(sys.executable).parent / "torchrun").exists():
            missing.append("torchrun")
        if missing:
            unavailable(
                f"{family} launcher not installed (missing {', '.join(missing)}); "
                "run `make system` as root (scripts/install-system-deps.sh)"
            )
        if family == "slurm" and os.geteuid() != 0:
            unavailable("the emulated Slurm cluster needs root (munged, slurmd, /etc/hosts entries)")


Launcher = Callable[..., shapes.Result]


#: Held while a Slurm cluster starts or stops: pytest-xdist workers each start their own cluster, and
#: starting one picks free ports, may start munged and may append node names to /etc/hosts.
CLUSTER_LOCK = Path(tempfile.gettempdir()) / "distinit-test-slurm-cluster.lock"
#: A munged that a stopped cluster left running because another cluster still used it: the cluster
#: stopped last stops it (by pid, after checking its command line).
MUNGED_LEFT = CLUSTER_LOCK.with_suffix(".munged.json")
#: The first job id of the next cluster: clusters side by side number their jobs apart, because distinit
#: derives MASTER_PORT from SLURM_JOB_ID and every cluster lives on this one host.
NEXT_JOB_ID = CLUSTER_LOCK.with_suffix(".next-job-id")
JOB_IDS_PER_CLUSTER = 10_000


@contextlib.contextmanager
def _cluster_lock() -> Iterator[None]:
    with CLUSTER_LOCK.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield


def start_cluster(workdir: Path, nodes: int = 3, owner: int | None = None) -> cluster.Cluster:
    """Start an emulated Slurm cluster in WORKDIR, one start or stop on the machine at a time.

    Its daemons end with process ``owner`` (default: this one) even when nobody calls :func:`stop_cluster`:
    a session killed before its teardown (SIGTERM, a CI timeout) leaves no Slurm daemon behind.
    """
    with _cluster_lock():
        try:
            first = int(NEXT_JOB_ID.read_text())
        except (OSError, ValueError):
            first = 1
        first = first if 0 < first < 60_000_000 else 1  # Slurm's MaxJobId is 67,043,328
        NEXT_JOB_ID.write_text(str(first + JOB_IDS_PER_CLUSTER))
        return cluster.start(workdir, nodes=nodes, first_job_id=first, owner=owner or os.getpid())


def stop_cluster(workdir: Path) -> None:
    """Stop WORKDIR's cluster; stop a munged our clusters started once no Slurm daemon needs it any more."""
    with _cluster_lock():
        try:
            ours = [p for p in cluster.load(workdir.resolve()).procs if p.name == "munged"]
        except FileNotFoundError:
            ours = []
        cluster.stop(workdir)
        for proc in ours:
            if cluster._alive(proc):  # left running for another cluster: the last one stops it
                MUNGED_LEFT.write_text(json.dumps(asdict(proc)))
        if MUNGED_LEFT.exists() and not cluster._others_use_munge(set()):
            cluster._stop_pid(cluster.Proc(**json.loads(MUNGED_LEFT.read_text())))
            MUNGED_LEFT.unlink()
