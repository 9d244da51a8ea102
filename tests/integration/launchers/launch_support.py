"""Helpers shared by the real-launcher tests and their fixtures (not a test module)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts" / "launchers"))

import cluster  # noqa: E402, F401 - re-exported for conftest
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
