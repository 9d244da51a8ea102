"""Local checks against the real machine: interfaces, /dev/shm-like directories, limits, bounds.

Nothing here starts a process or listens on a port: the stale entries of an exited process and the doctor's
listener are tested in ``tests/integration/doctor/test_doctor_local_live.py``.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from distinit.doctor import run
from distinit.doctor._bound import bounded
from distinit.doctor._local import check_limits, check_names
from distinit.doctor._model import Check
from distinit.doctor._route import check_route
from distinit.doctor._shm import check_shm
from distinit.env import DistEnv

WORLD = DistEnv(rank=0, local_rank=0, world_size=2, master_addr="127.0.0.1", master_port=29500, launcher="env")


def test_route_through_loopback_passes() -> None:
    check = check_route(WORLD, {})
    assert check.status == "pass" and check.evidence["interface"] == "lo"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("nosuch0", "no interface 'nosuch0' on this host"),
        ("^lo", "'^' is NCCL syntax"),
        ("=lo", "'=' is NCCL syntax"),
    ],
)
def test_gloo_interface_problems_are_named_with_the_fix(value: str, said: str) -> None:
    check = check_route(WORLD, {"GLOO_SOCKET_IFNAME": value})
    assert check.status == "fail" and said in check.summary and f"GLOO_SOCKET_IFNAME={value!r}" in check.summary
    assert check.fix and "export GLOO_SOCKET_IFNAME=lo" in check.fix


def test_nccl_and_tensorpipe_interfaces() -> None:
    assert check_route(WORLD, {"NCCL_SOCKET_IFNAME": "^lo,docker"}).status in ("pass", "fail")
    check = check_route(WORLD, {"NCCL_SOCKET_IFNAME": "zzz"})
    assert check.status == "fail" and "NCCL_SOCKET_IFNAME='zzz' selects no interface" in check.summary
    assert "TP_SOCKET_IFNAME='^lo'" in check_route(WORLD, {"TP_SOCKET_IFNAME": "^lo"}).summary


def test_route_without_master_is_skipped_and_unresolvable_fails() -> None:
    alone = DistEnv(rank=0, local_rank=0, world_size=1, launcher="none")
    assert check_route(alone, {}).status == "skip"
    unknown = DistEnv.model_validate({**WORLD.model_dump(), "master_addr": "no-such-host.invalid"})
    assert check_route(unknown, {}).status == "fail"


#: Two nodes, rank 0 elsewhere (an address that is not this host's): a world that spans hosts.
SPANNING = DistEnv.model_validate({**WORLD.model_dump(), "num_nodes": 2, "node_rank": 1, "master_addr": "192.0.2.1"})


def test_names_applies_setups_loopback_rule() -> None:
    from distinit.init._loopback import advertised_by_hostname

    trapped = advertised_by_hostname(socket.gethostname()).loopback
    check = check_names(SPANNING, socket.gethostname(), {})
    assert check.status == ("fail" if trapped else "pass"), check
    if trapped:
        assert check.evidence["loopback"] == ["hostname"] and check.fix
    # a named interface is the user's choice (setup() does not refuse it): never a names failure
    assert check_names(SPANNING, socket.gethostname(), {"GLOO_SOCKET_IFNAME": "lo"}).status == "pass"
    # a loopback MASTER_ADDR means one host, whatever the node count says
    multi = DistEnv.model_validate({**WORLD.model_dump(), "num_nodes": 2, "node_rank": 0})
    assert check_names(multi, socket.gethostname(), {}).status == "pass"
    assert check_names(WORLD, socket.gethostname(), {}).status == "pass"


def test_a_name_that_does_not_resolve_fails_names() -> None:
    unknown = DistEnv.model_validate({**WORLD.model_dump(), "master_addr": "no-such-host.invalid"})
    check = check_names(unknown, socket.gethostname(), {})
    assert check.status == "fail" and "MASTER_ADDR 'no-such-host.invalid' does not resolve" in check.summary


def test_the_route_fix_never_says_unset_a_variable_that_is_unset() -> None:
    unknown = DistEnv.model_validate({**WORLD.model_dump(), "master_addr": "no-such-host.invalid"})
    check = check_route(unknown, {})
    assert check.status == "fail" and check.fix and "unset" not in check.fix and "MASTER_ADDR" in check.fix
    named = check_route(WORLD, {"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert named.fix and "or unset it" in named.fix and "NCCL_SOCKET_IFNAME" not in named.fix


def test_shm_free_space_below_what_nccl_needs_fails(tmp_path: Path) -> None:
    check = check_shm(local_world_size=10**9, shm=str(tmp_path))
    assert check.status == "fail" and "NCCL needs" in check.summary and "NCCL_SHM_DISABLE=1" in (check.fix or "")
    assert check_shm(local_world_size=1, shm=str(tmp_path / "missing")).status == "fail"


def test_open_files_limit_against_the_world() -> None:
    assert check_limits(1).status == "pass"
    check = check_limits(10**7)
    assert check.status == "fail" and "ulimit -n" in (check.fix or "")


def _sleep_then_pass() -> Check:
    time.sleep(30)
    return Check(id="names", status="pass", summary="")


def test_a_hung_check_fails_within_its_bound_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    check = bounded(
        "names",
        _sleep_then_pass,
        timeout=0.3,
        waiting_for="the name resolver",
    )
    assert time.monotonic() - started < 2
    assert check.status == "fail" and "waiting for the name resolver" in check.summary
    crashed = bounded("shm", lambda: 1 // 0, timeout=5, waiting_for="x")  # type: ignore[arg-type,return-value]
    assert crashed.status == "fail" and "ZeroDivisionError" in crashed.summary


def test_a_bad_environment_is_exit_two_and_names_why() -> None:
    report = run(timeout=10, environ={"RANK": "0"})
    assert report.exit_status == 2 and report.check("env").status == "fail"
    assert report.check("consensus").status == "skip"
    with pytest.raises(ValueError, match="unknown check id"):
        run(skip=["nope"])
