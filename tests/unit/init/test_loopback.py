"""The loopback trap's pure decisions: gloo's address choice, "spans hosts", gloo's error text, the messages."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from distinit._guarded import Call
from distinit.env import DistEnv
from distinit.errors import RendezvousError
from distinit.init import _loopback, _messages, _thread
from distinit.init._loopback import Advertised

#: torch 2.13's own texts, from two fake hosts whose hostnames resolve to 127.0.1.1.
CONNECTOR = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] "
    "timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:16799$1"
)
LISTENER = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.h:311] "
    "Connect timeout [none]"
)


@pytest.mark.parametrize(
    ("resolved", "bindable", "chosen"),
    [
        pytest.param(["127.0.1.1"], {"127.0.1.1"}, ("127.0.1.1", "hostname"), id="debian-trap"),
        pytest.param(
            ["127.0.1.1", "10.0.0.5"], {"127.0.1.1", "10.0.0.5"}, ("127.0.1.1", "hostname"), id="loopback-first"
        ),
        pytest.param(["10.9.9.9", "10.0.0.5"], {"10.0.0.5"}, ("10.0.0.5", "hostname"), id="first-that-binds"),
        pytest.param(["10.9.9.9"], set(), ("127.0.0.1", "fallback"), id="none-binds-torch-fallback"),
        pytest.param([], set(), ("127.0.0.1", "fallback"), id="does-not-resolve"),
    ],
)
def test_gloo_advertises_the_first_address_that_binds(
    resolved: list[str], bindable: set[str], chosen: tuple[str, str]
) -> None:
    assert _loopback.choose_address(resolved, bindable.__contains__) == chosen


_HERE = {"master_local": True, "num_nodes": None, "local_world_size": None, "world_size": 8}
SPANS = [
    pytest.param({**_HERE, "master_addr": "127.0.0.1", "master_ips": ["127.0.0.1"], "num_nodes": 4}, None,
                 id="fake-nodes-loopback-master"),
    pytest.param({**_HERE, "master_addr": "localhost", "master_ips": ["::1", "127.0.0.1"], "num_nodes": 2}, None,
                 id="localhost-master-v6-and-v4"),
    pytest.param({**_HERE, "master_addr": "gpu-a", "master_ips": ["10.0.0.5"], "local_world_size": 8}, None,
                 id="torchrun-standalone-routable-master"),
    pytest.param({**_HERE, "master_addr": "1.2.3.4", "master_ips": ["1.2.3.4"], "master_local": False,
                  "num_nodes": 1}, None, id="nat-master-one-node"),
    pytest.param({**_HERE, "master_addr": "gpu-a", "master_ips": ["10.0.0.5"]}, None, id="master-here-env-silent"),
    pytest.param({**_HERE, "master_addr": "bad", "master_ips": None}, None, id="master-unresolvable-env-silent"),
    pytest.param({**_HERE, "master_addr": "gpu-a", "master_ips": ["10.0.0.5"], "num_nodes": 2},
                 "the launcher says 2 nodes, per SLURM_JOB_NUM_NODES", id="slurm-two-nodes"),
    pytest.param({**_HERE, "master_addr": "gpu-a", "master_ips": ["10.0.0.5"], "local_world_size": 4},
                 "only 4 of the 8 ranks run on this host, per LOCAL_WORLD_SIZE", id="local-world-smaller"),
    pytest.param({**_HERE, "master_addr": "gpu-a", "master_ips": ["10.0.0.5"], "master_local": False},
                 "MASTER_ADDR='gpu-a' (10.0.0.5) is not an address of this host", id="master-elsewhere"),
    pytest.param({**_HERE, "master_addr": "bad", "master_ips": None, "num_nodes": 3},
                 "the launcher says 3 nodes, per SLURM_JOB_NUM_NODES", id="master-unresolvable-three-nodes"),
]  # fmt: skip


@pytest.mark.parametrize(("facts", "evidence"), SPANS)
def test_spans_hosts(facts: dict[str, Any], evidence: str | None) -> None:
    found = _loopback.spans_hosts(**facts, nodes_from=("SLURM_JOB_NUM_NODES",), local_from=("LOCAL_WORLD_SIZE",))
    assert found == evidence


@pytest.mark.parametrize(
    ("text", "remote"),
    [
        pytest.param(CONNECTOR, "127.0.1.1:16799", id="torch-2.13-connector"),
        pytest.param(CONNECTOR.replace("127.0.1.1", "127.0.0.1"), "127.0.0.1:16799", id="GLOO_SOCKET_IFNAME-lo"),
        pytest.param(CONNECTOR.replace("127.0.1.1", "::1"), "::1:16799", id="ipv6-loopback"),
        pytest.param(LISTENER, None, id="listener-side-names-no-peer"),
        pytest.param(CONNECTOR.replace("127.0.1.1", "10.0.0.7"), None, id="routable-peer-refused"),
        pytest.param("Connection refused, remote=[127.0.0.1]:5", None, id="not-gloo-full-mesh"),
        pytest.param("", None, id="empty"),
    ],
)
def test_loopback_remote(text: str, remote: str | None) -> None:
    assert _loopback.loopback_remote(text) == remote


def test_fix_names_the_route_interface_and_lists_the_others() -> None:
    fix = _messages.loopback_fix(host="gpu-b", route="ib0", interfaces=[("eth0", "10.0.0.6"), ("ib0", "10.1.0.6")])
    assert "`export GLOO_SOCKET_IFNAME=ib0`" in fix
    assert "gpu-b has: eth0 10.0.0.6, ib0 10.1.0.6" in fix
    assert "/etc/hosts" in fix
    bare = _messages.loopback_fix(host="gpu-b", route=None, interfaces=[])
    assert "GLOO_SOCKET_IFNAME=<interface>" in bare and "no interface with an address" in bare
    assert "GLOO_SOCKET_IFNAME=eth0`" in _messages.loopback_fix(host="h", route=None, interfaces=[("eth0", "1.2.3.4")])


def test_preflight_message_and_the_mesh_verdict_share_the_fix() -> None:
    fix = _messages.loopback_fix(host="gpu-a", route="eth0", interfaces=[("eth0", "10.0.0.5")])
    early = _messages.loopback_advertised(
        rank=3, hostname="gpu-a", resolved=["127.0.1.1"], address="127.0.1.1", evidence="2 nodes", fix=fix
    )
    late = _messages.loopback_mesh(
        rank=1, host="gpu-b", remote="127.0.1.1:16799", evidence="2 nodes", fix=fix, master="gpu-a:29500", generation=0
    )
    assert type(early) is type(late) is RendezvousError
    assert early.fix == late.fix and early.why == late.why
    assert early.rank == 3 and "hostname 'gpu-a' resolves to 127.0.1.1" in early.what
    assert "remote=[127.0.1.1]" in early.what and "Not retried" in early.what
    assert "127.0.1.1:16799" in late.what and "generation 0" in late.what and late.generation == 0
    # the verdict travels as JSON on the store and is rebuilt word for word on every rank
    again = _messages.verdict_from_json(_messages.verdict_to_json(late), rank=0)
    assert type(again) is RendezvousError and str(again) == str(late) and again.rank == 0


def _world(**changes: Any) -> DistEnv:
    base = {"rank": 1, "world_size": 2, "local_rank": 0, "local_world_size": 1, "launcher": "env"}
    base.update(master_addr="10.254.0.1", master_port=29500)
    return DistEnv.model_validate({**base, **changes})


TRAPPED = Advertised(hostname="host-b", resolved=("127.0.1.1",), address="127.0.1.1", source="hostname")


@pytest.mark.parametrize(
    ("backend", "environ", "world", "raises"),
    [
        pytest.param("gloo", {}, _world(), True, id="gloo-two-hosts"),
        pytest.param("nccl", {}, _world(), False, id="nccl-not-concerned"),
        pytest.param("gloo", {"GLOO_SOCKET_IFNAME": "eth0"}, _world(), False, id="ifname-set-explicitly"),
        pytest.param("gloo", {}, _world(rank=0, world_size=1, local_world_size=1), False, id="world-of-one"),
    ],
)
def test_preflight_decision(
    monkeypatch: pytest.MonkeyPatch, backend: str, environ: dict[str, str], world: DistEnv, raises: bool
) -> None:
    monkeypatch.setattr(_loopback, "advertised_by_hostname", lambda hostname: TRAPPED)
    monkeypatch.setattr(_loopback, "world_spans_hosts", lambda env: "only 1 of the 2 ranks run on this host")
    if not raises:
        _loopback.check_advertised_address(backend, world, environ)
        return
    with pytest.raises(RendezvousError) as caught:
        _loopback.check_advertised_address(backend, world, environ)
    assert caught.value.rank == 1 and "'host-b' resolves to 127.0.1.1" in caught.value.what
    assert "GLOO_SOCKET_IFNAME=" in caught.value.fix


def test_preflight_quiet_when_the_hostname_is_routable_or_one_host(monkeypatch: pytest.MonkeyPatch) -> None:
    routable = Advertised(hostname="host-b", resolved=("10.0.0.6",), address="10.0.0.6", source="hostname")
    monkeypatch.setattr(_loopback, "advertised_by_hostname", lambda hostname: routable)
    _loopback.check_advertised_address("gloo", _world(), {})
    monkeypatch.setattr(_loopback, "advertised_by_hostname", lambda hostname: TRAPPED)
    monkeypatch.setattr(_loopback, "world_spans_hosts", lambda env: None)
    _loopback.check_advertised_address("gloo", _world(), {})


@pytest.mark.timeout(30)
def test_run_guarded_returns_an_early_verdict_while_the_thread_is_blocked() -> None:
    """A peer's verdict ends the caller's wait at once; the blocked thread is left behind, never joined."""
    release = threading.Event()

    def blocked() -> None:  # a native call that does not return on its own
        release.wait(20)

    verdict = RendezvousError("a peer's verdict")
    early = SimpleNamespace(verdict=None)
    threading.Timer(0.3, lambda: setattr(early, "verdict", verdict)).start()  # as InitWatch's thread sets it
    started = time.monotonic()
    handover = _thread.Handover()
    try:
        outcome = _thread.run_guarded(
            Call(blocked, name="test-blocked"),
            deadline_at=time.monotonic() + 60,
            handover=handover,
            early=early,
        )
        assert time.monotonic() - started < 5
        assert outcome.kind == "verdict" and outcome.error is verdict
        assert handover.abandoned and outcome.thread.is_alive()  # left behind, never joined
    finally:
        release.set()


def test_one_verdict_on_the_store_for_every_rank_and_none_on_one_host() -> None:
    """The connector publishes its loopback verdict; the listener (whose own text names no peer) reads the same
    one instead of starting a new generation; on one host a refusing loopback peer is just a dead peer."""

    from torch.distributed import HashStore

    from distinit.init._form import classify_init_failure
    from distinit.init._join import JoinProtocol

    def protocol(store: Any, namespace: str, master: str) -> JoinProtocol:
        return JoinProtocol(store, namespace=namespace, rank=1, world_size=2, master=master, hosting=False)

    store = HashStore()
    join = protocol(store, "distinit/job/0/c1/", "10.254.0.1:29500")
    connector = classify_init_failure(
        RuntimeError(CONNECTOR), join=join, generation=0, env=_world(rank=1), hosting=False
    )
    assert connector is not None and "a peer at 127.0.1.1:16799" in connector.what
    assert "only 1 of the 2 ranks run on this host" in connector.what and connector.rank == 1
    assert join.init_verdict_key(0) == "distinit/job/0/c1/g0/init_verdict" and store.check([join.init_verdict_key(0)])
    listener = classify_init_failure(
        RuntimeError(LISTENER), join=join, generation=0, env=_world(rank=0, local_rank=0), hosting=False
    )
    assert listener is not None and str(listener) == str(connector) and listener.rank == 0
    assert store.add(f"{join.init_verdict_key(0)}/seen", 0) == 2  # the board counts each reader once
    other = protocol(HashStore(), "n/", "127.0.0.1:29500")
    one_host = _world(master_addr="127.0.0.1", local_world_size=2, local_rank=1)
    assert classify_init_failure(RuntimeError(CONNECTOR), join=other, generation=0, env=one_host, hosting=False) is None
    assert classify_init_failure(RuntimeError(LISTENER), join=other, generation=0, env=one_host, hosting=False) is None
