"""expand_hostlist against a live ``scontrol show hostnames`` (run in a child process when scontrol is installed;
it needs only a ``slurm.conf``, no cluster), and the documented deviations still being what scontrol does.

The expansions themselves (Slurm 22.05.8's outputs, recorded) are checked without scontrol in
``tests/unit/env/test_hostlist.py``, whose table this file shares.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.unit.env.test_hostlist import EXPANSIONS

from distinit import MalformedEnvError, expand_hostlist

# Where distinit and scontrol 22.05.8 part ways on purpose (docs/env.md, "Hostlists"): (expression, scontrol's stdout).
DEVIATIONS = [
    ("n[1-]", "n1"),
    ("n[+1-3]", "n01 n02 n03"),
    ("n[1a-3]", "n01 n02 n03"),
    ("n[", "n]"),
    ("gpu[1-2]-ib", ""),  # scontrol rejects it (on stderr)
]


def _scontrol(tmp_path: Path, expr: str) -> str | None:
    """scontrol's expansion, space-separated; None when scontrol is not installed or cannot run."""
    binary = shutil.which("scontrol")
    if binary is None:
        return None
    conf = tmp_path / "slurm.conf"
    if not conf.exists():  # hostnames needs a configuration source, not a cluster
        conf.write_text(
            "ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL\n"
        )
    run = subprocess.run(
        [binary, "show", "hostnames", expr],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if "configuration source" in run.stderr:
        return None
    return " ".join(run.stdout.split())


@pytest.mark.parametrize(("expr", "hosts"), EXPANSIONS)
def test_matches_live_scontrol(tmp_path: Path, expr: str, hosts: list[str]) -> None:
    if expr.strip() in ("", "gpu[1-2]-ib", "my-host.example.org,n[1-2].ib"):
        pytest.skip("empty input / a suffix after a group: documented deviations")
    real = _scontrol(tmp_path, expr)
    if real is None:
        pytest.skip("scontrol is not installed or cannot run here")
    assert real == " ".join(hosts)


@pytest.mark.parametrize(("expr", "scontrol_says"), DEVIATIONS)
def test_documented_deviations_are_still_what_scontrol_does(tmp_path: Path, expr: str, scontrol_says: str) -> None:
    real = _scontrol(tmp_path, expr)
    if real is None:
        pytest.skip("scontrol is not installed or cannot run here")
    assert real == scontrol_says
    ours = None
    with contextlib.suppress(MalformedEnvError):
        ours = " ".join(expand_hostlist(expr))
    assert ours != real
