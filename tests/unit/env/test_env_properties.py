"""Property tests: hostile mixtures of real launcher variables never crash the resolver or yield an impossible world.

Variable names come from the real-launcher captures and the table cases; values mix plausible ones
with hostile ones (5000 digits, Unicode digits, signs, blanks, deep JSON, huge hostlists). The only
exception allowed out of ``env_from_scheduler`` is a ``SchedulerEnvError`` that names a variable, and
every world returned satisfies the invariants a torch world needs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distinit import DistEnv, MalformedEnvError, SchedulerEnvError, env_from_scheduler, expand_hostlist
from distinit._hostlist import MAX_HOSTS, MAX_NAME
from tests.unit.env.cases import BAD, GOOD

CAPTURES = Path(__file__).resolve().parents[2] / "integration" / "launchers" / "captures"
TASKS: list[dict[str, str]] = [
    task for path in sorted(CAPTURES.glob("*.json")) for task in json.loads(path.read_text())
]
ROWS: list[dict[str, str]] = [row.values[0] for row in (*GOOD, *BAD)]
NAMES = sorted({name for environ in (*TASKS, *ROWS) for name in environ})
BIG = "9" * 5000

_small = st.integers(min_value=0, max_value=9).map(str)
_hostile_number = st.sampled_from(
    [BIG, "-1", "+1", " 1", "1 ", "1_0", "0x10", "\u00b2", "\u0661", "1e3", "2147483648", "99999999999999999999", ""]
)
_hostlist = st.sampled_from(
    [
        "n[1-2]",
        "n[0-3]",
        "n[" + ",".join(["0-65535"] * 200) + "]",
        "n[" * 50,
        "a[1-2]b[1-2]c[1-2]",
        "n[ 1-3]",
        "[" * 3000,
    ]
)
_counts = st.sampled_from(["2(x2)", "1,3", "4", f"2(x{BIG})", "1(x100001)", "2(x", "\u00b2"])
_json = st.sampled_from(
    [
        '["algo-1", "algo-2"]',
        "[" * 3000,
        f"[{BIG}]",
        '{"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:1"]}, '
        '"task": {"type": "workerpool1", "index": -1}}',
        '{"cluster": {"workerpool0": [""]}, "task": {"type": "workerpool0", "index": 0}}',
        '{"cluster": {"workerpool0": ["h:\u00b2"]}, "task": {"type": "workerpool0", "index": 0}}',
        "{}",
    ]
)
_value = st.one_of(
    _small, _small, _small, _hostile_number, _hostlist, _counts, _json, st.text(max_size=20), st.just("algo-1")
)
_environ = st.dictionaries(st.sampled_from(NAMES), _value, max_size=12)


def _mutated(base: dict[str, str]) -> Any:
    """A real task's environment with a few variables replaced, added or removed."""
    changes = st.dictionaries(st.sampled_from(NAMES), st.one_of(_value, st.none()), min_size=1, max_size=4)
    return changes.map(lambda change: {k: v for k, v in {**base, **change}.items() if v is not None})


_realistic = st.sampled_from(TASKS + ROWS).flatmap(_mutated)


def _resolve(environ: dict[str, str]) -> DistEnv | SchedulerEnvError:
    try:
        return env_from_scheduler(environ)
    except SchedulerEnvError as exc:  # anything else fails the test
        return exc


def _check(environ: dict[str, str]) -> None:
    outcome = _resolve(environ)
    if isinstance(outcome, SchedulerEnvError):
        assert outcome.variables, f"{type(outcome).__name__} names no variable: {outcome}"
        assert len(str(outcome)) < 5000, "messages quote bounded parts of values"
    else:
        _assert_possible(outcome)


def _assert_possible(env: DistEnv) -> None:
    assert 0 <= env.rank < env.world_size
    assert 0 <= env.local_rank <= env.rank
    if env.local_world_size is not None:
        assert env.local_rank < env.local_world_size <= env.world_size
    if env.num_nodes is not None:
        assert env.num_nodes <= env.world_size
        if env.node_rank is not None:
            assert 0 <= env.node_rank < env.num_nodes
    if env.master_port is not None:
        assert 1 <= env.master_port <= 65535
    if env.master_addr is not None:
        assert env.master_addr.strip()


_FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(environ=_environ)
def test_random_mixtures_raise_only_scheduler_env_errors(environ: dict[str, str]) -> None:
    _check(environ)


@_FAST
@given(environ=_realistic)
def test_mutated_real_launches_raise_only_scheduler_env_errors(environ: dict[str, str]) -> None:
    _check(environ)


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


_hostile_hostlist = st.one_of(
    st.text(alphabet="n[]0123456789-, \t\u00b2", max_size=80),
    st.lists(st.sampled_from(["0-65535", "0-9", "00000001-2", BIG[:30], "", " 1"]), max_size=40).map(
        lambda ranges: "n[" + ",".join(ranges) + "]"
    ),
    st.lists(st.sampled_from(["[0-65535]", "[0-3]", "a" * 100, "-"]), max_size=8).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(expr=_hostile_hostlist)
def test_hostlists_in_bounded_time_and_size(expr: str) -> None:
    started = time.process_time()  # CPU time: a busy machine does not inflate it
    hosts: list[str] = []
    named: tuple[str, ...] = ("SLURM_NODELIST",)
    try:
        hosts = expand_hostlist(expr, variable="SLURM_NODELIST")
    except MalformedEnvError as exc:  # anything else fails the test
        named = exc.variables
    assert named == ("SLURM_NODELIST",)
    assert time.process_time() - started < 1.0
    assert len(hosts) <= MAX_HOSTS
    assert all(0 < len(host) <= MAX_NAME for host in hosts)
