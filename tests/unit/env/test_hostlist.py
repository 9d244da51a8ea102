"""expand_hostlist against `scontrol show hostnames` (Slurm 22.05.8 outputs from the env survey, section 8)."""

from __future__ import annotations

import pytest

from distinit import MalformedEnvError, expand_hostlist
from distinit.env._hostlist import expand_counts

EXPANSIONS = [
    pytest.param("", [], id="empty"),
    pytest.param("node01", ["node01"], id="plain"),
    pytest.param("n[010-012]", ["n010", "n011", "n012"], id="zero-padding-kept"),
    pytest.param("n[0-2]", ["n0", "n1", "n2"], id="no-padding-added"),
    pytest.param("n[098-101]", ["n098", "n099", "n100", "n101"], id="padding-width-from-lower-bound"),
    pytest.param("n[009-11]", ["n009", "n010", "n011"], id="padding-grows-hi"),
    pytest.param("n[8-09]", ["n8", "n9"], id="width-of-lower-bound-only"),
    pytest.param(
        "node[18-19,1-3,21-22]",
        ["node18", "node19", "node1", "node2", "node3", "node21", "node22"],
        id="order-kept-not-sorted",
    ),
    pytest.param("n[1-3,2-4]", ["n1", "n2", "n3", "n2", "n3", "n4"], id="duplicates-kept"),
    pytest.param(
        "rack[1-2]-node[01-03]", [f"rack{r}-node0{n}" for r in (1, 2) for n in (1, 2, 3)], id="two-groups-cartesian"
    ),
    pytest.param("n[1-2][3-4]", ["n13", "n14", "n23", "n24"], id="adjacent-groups"),
    pytest.param("a[1-2],b c", ["a1", "a2", "b", "c"], id="comma-and-space-separators"),
    pytest.param("alpha[3,1], beta", ["alpha3", "alpha1", "beta"], id="space-after-comma"),
    pytest.param("1.2.3.[089, 100-101]", ["1.2.3.089", "1.2.3.100", "1.2.3.101"], id="space-inside-group-stripped"),
    pytest.param("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"], id="suffix-after-group-accepted"),
    pytest.param("a,,b,", ["a", "b"], id="empty-items-skipped"),
    pytest.param("host[5-9,1]", ["host5", "host6", "host7", "host8", "host9", "host1"], id="lightning-root-case"),
    pytest.param("n[1]", ["n1"], id="single-value-group"),
    pytest.param("  n1\tn2\n", ["n1", "n2"], id="tabs-and-newlines"),
    pytest.param("my-host.example.org,n[1-2].ib", ["my-host.example.org", "n1.ib", "n2.ib"], id="fqdn-and-dots"),
]

INVALID = [
    pytest.param("n[3-1]", "backwards", id="backwards-range"),
    pytest.param("n[]", "empty element", id="empty-group"),
    pytest.param("n[x]", "not a number", id="letters-in-group"),
    pytest.param("n[1,]", "empty element", id="trailing-comma-in-group"),
    pytest.param("n[,1]", "empty element", id="leading-comma-in-group"),
    pytest.param("n[-1]", "not a number", id="negative"),
    pytest.param("n[1-10x]", "not a number", id="junk-after-range"),
    pytest.param("n[[1]]", "nested", id="nested-brackets"),
    pytest.param("n[1-1000000]", "more than 65536", id="range-too-long"),
    pytest.param("n[", "never closed", id="unclosed"),
    pytest.param("n]", "without a matching", id="stray-closing"),
    pytest.param("n[1-]", "not a number", id="open-range"),
    pytest.param("n[1x2]", "not a number", id="box-syntax-rejected"),
    pytest.param("r[0-999]n[0-999]", "more than 100000", id="product-too-large"),
]


@pytest.mark.parametrize(("expr", "hosts"), EXPANSIONS)
def test_expands_like_scontrol(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize(("expr", "problem"), INVALID)
def test_rejects_invalid(expr: str, problem: str) -> None:
    with pytest.raises(MalformedEnvError, match=problem) as caught:
        expand_hostlist(expr)
    assert repr(expr) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_names_the_variable() -> None:
    with pytest.raises(MalformedEnvError) as caught:
        expand_hostlist("n[3-1]", variable="SLURM_STEP_NODELIST")
    assert caught.value.variables == ("SLURM_STEP_NODELIST",)
    assert "SLURM_STEP_NODELIST='n[3-1]'" in str(caught.value)


@pytest.mark.parametrize(
    ("expr", "counts"),
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("5,1(x2)", [5, 1, 1]), ("1(x2)", [1, 1]), ("3,1", [3, 1])],
)
def test_expands_counts(expr: str, counts: list[int]) -> None:
    assert expand_counts(expr, variable="SLURM_STEP_TASKS_PER_NODE") == counts


@pytest.mark.parametrize("expr", ["", "2(x)", "x2", "2(3)", "1(x2", "-1", "2(x999999999)"])
def test_rejects_bad_counts(expr: str) -> None:
    with pytest.raises(MalformedEnvError) as caught:
        expand_counts(expr, variable="SLURM_TASKS_PER_NODE")
    assert caught.value.variables == ("SLURM_TASKS_PER_NODE",)
