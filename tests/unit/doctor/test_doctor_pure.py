"""The doctor's pure pieces: report model and exit codes, rendering, consensus, merging, plans, clock maths."""

from __future__ import annotations

import json

import pytest

from distinit._identity import HostIdentity, RankClaim, group_ranks
from distinit.doctor import Check, DoctorReport
from distinit.doctor._clock import offset_from, verdict
from distinit.doctor._consensus import consensus, differences
from distinit.doctor._merge import bandwidth_check, excuse_loopback, merge_local, reach_check
from distinit.doctor._model import make_report, worst
from distinit.doctor._nodes import nodes
from distinit.doctor._reach import reach_plan
from distinit.doctor._render import one_line, render
from distinit.doctor._route import nccl_matches


def report(*statuses: tuple[str, str], rank: int = 0) -> DoctorReport:
    checks = [
        Check.model_validate(
            {"id": i, "status": s, "summary": f"{i} is {s}", "fix": None if s == "pass" else "do x", "ranks": (1,)}
        )
        for i, s in statuses
    ]
    return make_report(checks, world_size=2, rank=rank, elapsed_s=0.5)


def test_exit_status_zero_one_two() -> None:
    assert report(("env", "pass"), ("shm", "warn")).exit_status == 0
    assert report(("env", "pass"), ("route", "fail")).exit_status == 1
    assert report(("env", "fail"), ("route", "fail")).exit_status == 2


def test_json_shape_is_the_documented_one() -> None:
    document = json.loads(report(("env", "pass"), ("shm", "warn")).model_dump_json())
    assert set(document) >= {"ok", "world_size", "elapsed_s", "checks"}
    assert set(document["checks"][0]) == {"id", "status", "summary", "fix", "ranks", "hosts", "evidence"}
    assert DoctorReport.model_validate(document) == report(("env", "pass"), ("shm", "warn"))


def test_worst_and_about() -> None:
    assert worst(["skip", "pass", "warn"]) == "warn" and worst([]) == "pass"
    mine = report(("env", "pass"), ("shm", "warn"), ("route", "fail"), rank=1)
    assert [c.id for c in mine.about(1)] == ["shm", "route"]
    assert not mine.about(0)


def test_render_lists_every_check_then_the_fixes_then_the_verdict() -> None:
    text = render(report(("env", "pass"), ("shm", "warn"), ("route", "fail")), title="world of 2 rank(s)")
    lines = text.splitlines()
    assert lines[0] == "distinit doctor: world of 2 rank(s)"
    assert "FAIL  route" in text and "WARN  shm" in text and "pass  env" in text
    assert "  route: do x" in text
    assert lines[-1] == "verdict: FAILED (1 failed: route; 1 warning: shm) in 0.50 s"
    assert render(report(("env", "pass")), title="t").splitlines()[-1] == "verdict: ok in 0.50 s"


def test_one_line_names_only_this_ranks_problems() -> None:
    assert (
        one_line(report(("env", "pass"), rank=1), host="h")
        == "distinit doctor: rank 1 (h): ok; rank 0 prints the report"
    )
    line = one_line(report(("route", "fail"), rank=1), host="h")
    assert line == (
        "distinit doctor: rank 1 (h): FAILED (1 failed: route); rank 0 prints the report; "
        "here: fail route: route is fail"
    )


FACTS = {
    "versions": {"python": "3.11.9", "torch": "2.13.0"},
    "backends": {"gloo": True},
    "variables": {"NCCL_DEBUG": "WARN"},
    "digest": "x",
}


def facts(**variables: str) -> dict[str, object]:
    return {**FACTS, "variables": {**FACTS["variables"], **variables}, "digest": json.dumps(variables)}  # type: ignore[dict-item]


def test_consensus_names_the_minority_rank_host_and_value() -> None:
    per_rank = {0: facts(), 1: facts(NCCL_IB_DISABLE="1"), 2: facts(), 3: facts()}
    check = consensus(per_rank, host_of={0: "a", 1: "b", 2: "a", 3: "b"})
    assert check.status == "fail" and check.ranks == (1,) and check.hosts == ("b",)
    assert "NCCL_IB_DISABLE: rank 1 (b) '1' vs '<unset>' on 3 ranks" in check.summary


def test_consensus_tie_goes_to_rank_zero_and_interface_names_only_warn() -> None:
    (diff,) = differences({0: facts(NCCL_SOCKET_IFNAME="eth0"), 1: facts(NCCL_SOCKET_IFNAME="ens5")})
    assert diff["majority"] == "eth0" and diff["minority"] == {1: "ens5"}
    check = consensus({0: facts(NCCL_SOCKET_IFNAME="eth0"), 1: facts(NCCL_SOCKET_IFNAME="ens5")}, host_of={})
    assert check.status == "warn"
    other = {**FACTS, "versions": {"python": "3.11.9", "torch": "2.12.0"}}
    assert consensus({0: FACTS, 1: FACTS, 2: other}, host_of={2: "c"}).summary.startswith(
        "ranks disagree: version torch: rank 2 (c) '2.12.0' vs '2.13.0' on 2 ranks"
    )
    assert consensus({0: FACTS, 1: FACTS}, host_of={}).status == "pass"


def test_an_interface_set_per_host_is_no_disagreement() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    per_host = {r: facts(GLOO_SOCKET_IFNAME="eth0" if r < 2 else "ens5") for r in range(4)}
    check = consensus(per_host, host_of=hosts)
    assert check.status == "pass" and check.evidence["per_host"] == {"GLOO_SOCKET_IFNAME": {"a": "eth0", "b": "ens5"}}
    mixed = {**per_host, 1: facts(GLOO_SOCKET_IFNAME="ens5")}  # two values on host a: worth a warning
    assert consensus(mixed, host_of=hosts).status == "warn"


def test_merge_local_keeps_the_worst_and_names_its_ranks() -> None:
    ok = Check(id="shm", status="pass", summary="fine").model_dump(mode="json")
    bad = Check(id="shm", status="fail", summary="1 MiB", fix="enlarge").model_dump(mode="json")
    (merged,) = merge_local({0: [ok], 1: [bad], 2: [ok], 3: [bad]}, host_of={1: "b", 3: "d"})
    assert merged.status == "fail" and merged.ranks == (1, 3) and merged.hosts == ("b", "d")
    assert merged.summary == "ranks [1, 3] (b, d): 1 MiB" and merged.fix == "enlarge"  # one cause, said once
    other = Check(id="shm", status="fail", summary="2 MiB", fix="enlarge").model_dump(mode="json")
    (mixed,) = merge_local({0: [ok], 1: [bad], 3: [other]}, host_of={1: "b", 3: "d"})
    assert mixed.summary == "rank 1 (b): 1 MiB; rank 3 (d): 2 MiB"
    (clean,) = merge_local({0: [ok], 1: [ok]}, host_of={})
    assert clean.status == "pass" and clean.summary == "all ranks: fine"


def test_loopback_names_are_a_warning_only_when_every_host_shares_one_kernel() -> None:
    loopback = Check(
        id="names",
        status="fail",
        summary="MASTER_ADDR 'dnode1' resolves to loopback ['127.0.0.1'] in a multi-node world",
        fix="set MASTER_ADDR",
        evidence={"loopback": ["MASTER_ADDR"], "problems": 1},
    ).model_dump(mode="json")
    unresolved = {**loopback, "evidence": {"loopback": ["hostname"], "problems": 2}}
    per_rank = {0: [loopback], 1: [loopback], 2: [unresolved]}
    claims = [
        RankClaim(rank=r, identity=HostIdentity(hostname="vm", boot_id="k", netns=1, launcher_node=f"n{r}"))
        for r in range(3)
    ]
    fake = group_ranks(claims)
    excused = excuse_loopback(per_rank, layout=fake)
    assert [d["status"] for dumps in excused.values() for d in dumps] == ["warn", "warn", "fail"]
    assert "share one kernel" in excused[0][0]["summary"] and excused[0][0]["fix"].endswith("set MASTER_ADDR")
    real = group_ranks(
        [c.model_copy(update={"identity": c.identity.model_copy(update={"boot_id": f"k{c.rank}"})}) for c in claims]
    )
    assert excuse_loopback(per_rank, layout=real) == per_rank
    (merged,) = merge_local(excused, host_of={})
    assert merged.status == "fail" and merged.ranks == (2,)


def test_two_ranks_of_one_host_on_one_device_fail_gpu() -> None:
    def gpu(uuid: str) -> dict[str, object]:
        return Check(id="gpu", status="pass", summary="ok", evidence={"uuid": uuid}).model_dump(mode="json")

    per_rank = {0: [gpu("GPU-a")], 1: [gpu("GPU-a")], 2: [gpu("GPU-a")], 3: [gpu("GPU-b")]}
    (merged,) = merge_local(per_rank, host_of={0: "h1", 1: "h1", 2: "h2", 3: "h2"})
    assert merged.status == "fail" and merged.ranks == (0, 1) and merged.hosts == ("h1",)
    assert "ranks [0, 1] on h1 share device GPU-a" in merged.summary
    (fine,) = merge_local({0: [gpu("GPU-a")], 1: [gpu("GPU-a")]}, host_of={0: "h1", 1: "h2"})
    assert fine.status == "pass"


def test_reach_check_names_the_failing_pairs_only() -> None:
    led = {
        "a": {"reach_tested": 2, "reach_failures": [["c", "timeout"]]},
        "b": {"reach_tested": 2, "reach_failures": []},
        "c": {"reach_tested": 2, "reach_failures": []},
    }
    check = reach_check(led, ranks_of={"a": (0,), "b": (1,), "c": (2,)})
    assert check.status == "fail" and check.hosts == ("a", "c") and check.ranks == (0, 2)
    assert check.summary == "1 of 6 host pairs cannot connect: a -> c: timeout"
    assert reach_check({"a": {"reach_tested": 0}}, ranks_of={}).status == "skip"


def test_bandwidth_check_names_slow_links() -> None:
    led = {h: {"bandwidth": [n, rate]} for h, n, rate in (("a", "b", 1.0), ("b", "c", 1.1), ("c", "a", 0.1))}
    check = bandwidth_check(led, ranks_of={})
    assert check.status == "warn" and "c -> a: 0.10 GB/s" in check.summary and check.hosts == ("c", "a")


def test_reach_plan_full_mesh_then_sampled() -> None:
    assert reach_plan(3) == [[1, 2], [0, 2], [0, 1]]
    plan = reach_plan(1024, peers=8)
    assert plan == reach_plan(1024, peers=8)  # every rank computes the same plan
    for i, targets in enumerate(plan):
        assert targets[0] == (i + 1) % 1024 and i not in targets
        assert len(targets) == len(set(targets)) == 9
    assert all(len(t) <= 3 for t in reach_plan(70, full_mesh=64, peers=2))


def test_clock_offset_and_verdict_thresholds() -> None:
    assert offset_from(100.0, 40.0, 100.2) == pytest.approx((60.1, 0.1))
    ranks_of = {"a": (0,), "b": (1,), "c": (2,)}
    fine = verdict({"a": [0.0, 0.001], "b": [0.2, 0.001]}, ranks_of=ranks_of, reference="a")
    assert fine.status == "pass"
    slow = verdict({"a": [0.0, 0.001], "b": [2.0, 0.001]}, ranks_of=ranks_of, reference="a")
    assert slow.status == "warn" and slow.hosts == ("b",)
    bad = verdict({"a": [0.0, 0.0], "b": [60.0, 0.001], "c": "timeout"}, ranks_of=ranks_of, reference="a")
    assert bad.status == "fail" and bad.hosts == ("b", "c") and bad.ranks == (1, 2)
    assert "b +60.000 s" in bad.summary and "c: timeout" in bad.summary


def test_nodes_check_names_hosts_claiming_one_node_rank() -> None:
    a, b = (HostIdentity(hostname=n, boot_id="same") for n in ("fake-a", "fake-b"))
    layout = group_ranks([RankClaim(rank=0, identity=a, node_rank=0), RankClaim(rank=1, identity=b, node_rank=0)])
    check = nodes(layout)
    assert check.status == "fail" and check.hosts == ("fake-a", "fake-b")
    assert "2 hosts claim node rank 0: fake-a, fake-b" in check.summary


def test_nccl_interface_syntax() -> None:
    names = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert nccl_matches("eth", names) == ["eth0", "eth1"]
    assert nccl_matches("=eth0", names) == ["eth0"]
    assert nccl_matches("^lo,docker", names) == ["eth0", "eth1", "ib0"]
    assert nccl_matches("^=eth0", names) == ["lo", "eth1", "ib0", "docker0"]
