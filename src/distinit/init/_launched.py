"""How many processes the launcher itself started, by its own count: the yardstick for an oversized WORLD_SIZE.

``WORLD_SIZE`` exported by hand (or computed in a job script) can be larger than what was launched; the
ranks that were never started are then "missing" until the deadline. The launcher's own count says so
at once. Read from the raw environment, innermost launcher first (torchrun inside srun, mpirun inside
an allocation); Slurm only inside a step (``SLURM_STEP_NUM_TASKS``): a batch script's ``SLURM_NTASKS``
counts the allocation, not the processes the script started.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The variables that hold a launcher's process count, innermost launcher first.
_COUNT_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")


def _count(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def launched(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """``(count, "VAR=count")`` of the processes the launcher started, or None when no launcher says."""
    if environ.get("TORCHELASTIC_RUN_ID"):
        local, nodes = _count(environ, "LOCAL_WORLD_SIZE"), _count(environ, "GROUP_WORLD_SIZE")
        if local is None or nodes is None:
            return None
        return local * nodes, f"torchrun: LOCAL_WORLD_SIZE={local} x {nodes} node(s)"
    for name in _COUNT_VARIABLES:
        count = _count(environ, name)
        if count is not None:
            return count, f"{name}={count}"
    return None
