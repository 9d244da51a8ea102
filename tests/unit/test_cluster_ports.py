"""The test Slurm cluster's daemon ports and the init tests' picked ports never meet a port another job derives.

A slurmd accepts any TCP connection and never answers torch's store handshake: a derived MASTER_PORT equal to an
emulated node's slurmd port made that job's ranks report "something is listening ... not a torch TCPStore".
"""

from __future__ import annotations

import ast
from pathlib import Path

from distinit._port import DERIVED_PORTS

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "launchers" / "cluster.py"
INIT_LAUNCH = ROOT / "tests" / "integration" / "init" / "init_launch.py"
#: Lightning's default MASTER_PORT under Slurm: 15000 + the job id's last 4 digits.
LIGHTNING_SLURM = range(15000, 25000)
EPHEMERAL = range(32768, 61000)


def _range(path: Path, name: str) -> range:
    """The ``range(...)`` that ``path`` assigns to ``name`` (read, not run: cluster.py starts daemons)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assert isinstance(node.value, ast.Call), ast.dump(node.value)
            return range(*(ast.literal_eval(a) for a in node.value.args))
    raise AssertionError(f"{path.name} assigns no {name}")


def test_the_daemon_and_picked_ports_are_outside_every_range_a_job_picks_from() -> None:
    chosen = _range(CLUSTER, "PORT_RANGE")
    daemons = range(chosen.start, chosen.stop + 10)  # each base and its node ports
    picked = _range(INIT_LAUNCH, "PORTS")
    derived = range(DERIVED_PORTS[0], DERIVED_PORTS[1] + 1)
    for ours in (daemons, picked):
        for taken in (derived, LIGHTNING_SLURM, EPHEMERAL, range(29500, 29501)):
            assert not set(ours) & set(taken), (ours, taken)
    assert not set(daemons) & set(picked)
