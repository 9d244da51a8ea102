"""Fixtures for the Lightning tests: an ``os.environ`` in which Lightning sees no launcher."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: Variables that would make Lightning (or the resolver reading os.environ) see a launcher.
LAUNCHER_PREFIXES = ("OMPI_", "PMI", "MPI_", "SLURM_", "TORCHELASTIC_", "PALS_", "JSM_", "HOROVOD_", "MV2_")
TORCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR")


@pytest.fixture
def clean_environ() -> Iterator[None]:
    """os.environ without launcher variables, and Lightning's rank-zero state, restored afterwards."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    saved, rank = dict(os.environ), rank_zero_only.rank
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in (*TORCH_NAMES, "MASTER_PORT"):
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)
    rank_zero_only.rank = rank
