"""Property tests: hostile mixtures of real launcher variables never crash the resolver or yield an impossible world.

Variable names come from the real-launcher captures and the table cases; values mix plausible ones
with hostile ones (5000 digits, Unicode digits, signs, blanks, deep JSON, huge hostlists). The only
exception allowed out of ``env_from_scheduler`` is a ``SchedulerEnvError`` that names a variable, and
every world returned satisfies the invariants a torch world needs. Hostlists expand in bounded time and size;
their comparison with a live ``scontrol`` is in ``tests/integration/env/test_env_properties_process.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

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
