"""Property test: random Slurm hostlists expand exactly as ``scontrol show hostnames`` does.

Runs the real ``scontrol`` (Slurm 22.05; it needs only a ``slurm.conf``, no cluster) once per example, in a
child process; skipped where it is not installed. The resolver's property tests are in
``tests/unit/env/test_env_properties.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distinit import expand_hostlist

_text_piece = st.text(alphabet="ab-.", max_size=3)
_bound = st.integers(min_value=0, max_value=120)


@st.composite
def _element(draw: st.DrawFn) -> str:
    """``lo`` or ``lo-hi`` with optional zero padding and the whitespace scontrol accepts."""
    low = draw(_bound)
    low_text = draw(st.sampled_from(["", " ", "\t"])) + str(low).zfill(draw(st.integers(0, 4)))
    if draw(st.booleans()):
        return low_text
    high = low + draw(st.integers(0, 6))
    return low_text + draw(st.sampled_from(["", " "])) + "-" + draw(st.sampled_from(["", " "])) + str(high)


@st.composite
def _slurm_item(draw: st.DrawFn) -> str:
    """text[group]text[group]...: ends with a group, as Slurm requires once there is one.

    Items start with a letter: scontrol would take a leading '-' for an option.
    """
    groups = draw(st.integers(0, 4))
    if groups == 0:
        return "n" + draw(_text_piece)
    pieces = ["n" + draw(_text_piece) + "[" + ",".join(draw(st.lists(_element(), min_size=1, max_size=3))) + "]"]
    pieces += ["x" + draw(_text_piece) + "[" + ",".join(draw(st.lists(_element(), min_size=1, max_size=2))) + "]"
               for _ in range(groups - 1)]  # fmt: skip
    return "".join(pieces)


_slurm_hostlist = st.lists(_slurm_item(), min_size=1, max_size=3).map(",".join)


def _scontrol(expr: str, conf: Path) -> str | None:
    binary = shutil.which("scontrol")
    if binary is None:
        return None
    run = subprocess.run(
        [binary, "show", "hostnames", expr],
        env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return None if "configuration source" in run.stderr else " ".join(run.stdout.split())


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL\n")
    if shutil.which("scontrol") is None or _scontrol("n1", conf) != "n1":
        pytest.skip("scontrol is not installed or cannot run here")
    return conf


@settings(max_examples=150, deadline=None)
@given(expr=_slurm_hostlist)
def test_hostlists_expand_exactly_as_scontrol(slurm_conf: Path, expr: str) -> None:
    assert " ".join(expand_hostlist(expr)) == _scontrol(expr, slurm_conf), expr
