"""expand_hostlist against `scontrol show hostnames` (outputs of Slurm 22.05.8's scontrol, recorded here).

Pure: the live comparison with an installed scontrol (a child process) is in
``tests/integration/env/test_hostlist_process.py``, which shares :data:`EXPANSIONS`.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from distinit import MalformedEnvError, expand_hostlist
from distinit._hostlist import expand_counts

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
    pytest.param("1.2.3.[089, 100-101]", ["1.2.3.089", "1.2.3.0100", "1.2.3.0101"], id="space-counts-in-width"),
    pytest.param("n[ 1-3]", ["n01", "n02", "n03"], id="leading-space-pads"),
    pytest.param("n[1 -3]", ["n01", "n02", "n03"], id="space-before-dash-pads"),
    pytest.param("n[1- 3]", ["n1", "n2", "n3"], id="space-after-dash-does-not-pad"),
    pytest.param("n[1 - 3]", ["n01", "n02", "n03"], id="spaces-around-dash"),
    pytest.param("n[ 01-3]", ["n001", "n002", "n003"], id="space-and-zero-pad"),
    pytest.param("n[\t1-2]", ["n01", "n02"], id="tab-pads-like-a-space"),
    pytest.param("n[1, 3]", ["n1", "n03"], id="space-after-comma-in-group"),
    pytest.param("n[ 8-10]", ["n08", "n09", "n10"], id="space-width-two"),
    pytest.param(
        "a[1-2]b[1-2]c[1-2]",
        ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"],
        id="three-groups-second-to-last-slowest",
    ),
    pytest.param(
        "a[2,1]b[4,3]c[6,5]",
        ["a2b4c6", "a2b4c5", "a1b4c6", "a1b4c5", "a2b3c6", "a2b3c5", "a1b3c6", "a1b3c5"],
        id="three-groups-order-within-group-kept",
    ),
    pytest.param(
        "a[1-2]b[1-2]c[1-2]d[1-2]",
        [f"a{a}b{b}c{c}d{d}" for c in (1, 2) for b in (1, 2) for a in (1, 2) for d in (1, 2)],
        id="four-groups",
    ),
    pytest.param(
        "n[3,1-2]x[1-2]y[2,1],z",
        [f"n{n}x{x}y{y}" for x in (1, 2) for n in (3, 1, 2) for y in (2, 1)] + ["z"],
        id="three-groups-then-plain",
    ),
    pytest.param("a[1-2]-[1-2]", ["a1-1", "a1-2", "a2-1", "a2-2"], id="text-between-groups"),
    pytest.param("[1-2]", ["1", "2"], id="group-only"),
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
    pytest.param("n[1 ]", "not a number", id="trailing-space-in-single"),
    pytest.param("n[1-3 ]", "not a number", id="trailing-space-after-range"),
    pytest.param("n[ ]", "not a number", id="blank-element"),
    pytest.param("n[+1-3]", "not a number", id="sign-rejected"),
    pytest.param("n[1a-3]", "not a number", id="junk-before-dash-rejected"),
    pytest.param("n[\u00b2]", "not a number", id="unicode-digit"),
    pytest.param("n[" + "9" * 5000 + "]", "above", id="five-thousand-digits"),
    pytest.param("n[18446744073709551616]", "above", id="beyond-unsigned-long"),
    pytest.param("a" * 300, "characters long", id="name-too-long"),
    pytest.param("n[" + "0" * 300 + "1-2]", "characters long", id="padding-too-long"),
]


@pytest.mark.parametrize(("expr", "hosts"), EXPANSIONS)
def test_expands_like_scontrol(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize(("expr", "problem"), INVALID)
def test_rejects_invalid(expr: str, problem: str) -> None:
    with pytest.raises(MalformedEnvError, match=problem) as caught:
        expand_hostlist(expr)
    assert repr(expr)[:60] in str(caught.value)
    assert len(str(caught.value)) < 1000, "a hostile value must not flood the message"
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


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "expr",
    [
        "n[" + ",".join(["0-65535"] * 500) + "]",  # 4 KB: 32 million names before the cap counted first
        "a[0-65535]b[0-65535]",
        ",".join(["n[0-65535]"] * 2),
        "n[" + ",".join(["0-65535"] * 16000) + "]",  # 128 KB, the size of the whole environment
    ],
    ids=["4KB-one-group", "two-full-groups", "two-items", "128KB"],
)
def test_cap_is_counted_before_building(expr: str) -> None:
    tracemalloc.start()
    started = time.process_time()  # this process's CPU time: a busy machine does not inflate it, wall time did
    try:
        with pytest.raises(MalformedEnvError, match="more than 100000 names"):
            expand_hostlist(expr, variable="SLURM_NODELIST")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - started < 5.0  # the old code took 6.7 s for the 4 KB case without tracemalloc
    assert peak < 64 * 2**20, f"{peak} bytes"


def test_largest_accepted_expansion_is_bounded() -> None:
    tracemalloc.start()
    try:
        hosts = expand_hostlist("n" * 200 + "[0-65535]," + "m" * 200 + "[0-34463]")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(hosts) == 100_000
    assert peak < 128 * 2**20, f"{peak} bytes"
