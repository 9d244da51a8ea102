"""init/_store.py's decisions, without a socket: what a failure to host or reach the store becomes.

The network calls are replaced where the module makes them (``_serve``, ``TCPStore``, ``probe``, ``binds``,
``port_holder``, ``getaddrinfo``), so each decision is checked on the value that drives it: the error a store
server raised, what a probe saw, how long a failure lasted. The real sockets are in
``tests/integration/init/test_init_probe.py``, ``test_init_master_addr.py`` and ``test_fail_fast_socket.py``.
"""

from __future__ import annotations

import random
import socket
import time
from typing import Any

import pytest

from distinit._net import ProbeKind, ProbeResult
from distinit.errors import MasterUnreachableError, PortInUseError
from distinit.init import _store
from distinit.init._policy import AttemptFailed, Grace, Unsupported
from distinit.init._store import Master

MASTER = Master(addr="10.0.0.9", port=29500, rank=3)


@pytest.mark.parametrize(
    ("message", "busy"),
    [
        pytest.param(
            "The server socket has failed to listen on any local network address. EADDRINUSE", True, id="libuv"
        ),
        pytest.param("Address already in use", True, id="legacy"),
        pytest.param("bind failed (errno: 98 - ...)", True, id="errno"),
        pytest.param("Connection refused", False, id="refused"),
        pytest.param("errno: 99 - Cannot assign requested address", False, id="another-errno"),
    ],
)
def test_a_server_error_says_whether_the_port_is_taken(message: str, busy: bool) -> None:
    assert _store.is_port_busy(RuntimeError(message)) is busy


def test_the_master_is_local_only_on_this_host() -> None:
    assert Master(addr="127.0.0.1", port=1, rank=0).is_local()
    assert Master(addr=socket.gethostname(), port=1, rank=0).is_local()
    assert not MASTER.is_local() and MASTER.name == "10.0.0.9:29500"


@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        pytest.param("dns", MasterUnreachableError, "cannot resolve MASTER_ADDR='10.0.0.9'", id="dns"),
        pytest.param("unreachable", MasterUnreachableError, "has no route to MASTER_ADDR", id="unreachable"),
        pytest.param("timeout", MasterUnreachableError, "connection attempts time out", id="timeout"),
        pytest.param("port_busy", PortInUseError, "pid 4 (held)", id="port-busy-names-the-holder"),
        pytest.param("foreign", PortInUseError, "is not a torch TCPStore", id="foreign"),
    ],
)
def test_each_persistent_failure_has_its_own_error(
    monkeypatch: pytest.MonkeyPatch, kind: Any, error: type[Exception], words: str
) -> None:
    looked: list[int] = []

    def holder(port: int) -> str:
        looked.append(port)
        return "pid 4 (held)"

    monkeypatch.setattr(_store, "port_holder", holder)
    exc = _store.specific_error(AttemptFailed(kind, f"{MASTER.name}: the detail"), 61.0, MASTER)
    assert type(exc) is error and exc.rank == 3 and words in str(exc), str(exc)
    # The holder of a port is looked up on this host only: for a foreign listener, only when the master is here.
    assert looked == ([29500] if kind == "port_busy" else [])


def test_a_foreign_listener_on_this_host_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store, "port_holder", lambda port: "pid 5 (nginx)")
    here = Master(addr="127.0.0.1", port=29500, rank=1)
    assert "pid 5 (nginx)" in str(_store.specific_error(AttemptFailed("foreign", "x"), 10.0, here))


def test_escalate_raises_only_once_a_failure_outlasted_its_grace() -> None:
    grace = Grace(foreign=10.0, dns=5.0)
    failure = AttemptFailed("dns", "MASTER_ADDR='x' does not resolve")
    now = time.monotonic()
    _store.escalate(grace, failure, since=now - 1.0, master=MASTER)  # 1 s of 5: retried
    _store.escalate(grace, AttemptFailed("refused", "nobody"), since=now - 100.0, master=MASTER)  # no grace: never
    with pytest.raises(MasterUnreachableError):
        _store.escalate(grace, failure, since=now - 6.0, master=MASTER)  # a new streak that began 6 s ago


@pytest.mark.parametrize(
    ("raised", "outcome"),
    [
        pytest.param(RuntimeError("EADDRINUSE"), "port_busy", id="busy"),
        pytest.param(RuntimeError("some store failure"), "store", id="transient"),
        pytest.param(TypeError("__init__() got an unexpected keyword argument 'use_libuv'"), "unsupported", id="old"),
    ],
)
def test_hosting_the_store_says_what_its_failure_is(
    monkeypatch: pytest.MonkeyPatch, raised: Exception, outcome: str
) -> None:
    monkeypatch.setattr(_store, "_ipv4_listener", lambda host, port: None)

    def serve(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(_store, "_serve", serve)
    with pytest.raises((AttemptFailed, Unsupported)) as caught:
        _store.host_store("127.0.0.1", 29500, timeout=1.0)
    if outcome == "unsupported":
        assert isinstance(caught.value, Unsupported) and caught.value.cause is raised
    else:
        assert isinstance(caught.value, AttemptFailed) and caught.value.kind == outcome
    assert caught.value.__cause__ is raised


class FakeStore:
    """A TCPStore constructor that raises ``error``."""

    error: BaseException | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        if FakeStore.error is not None:
            raise FakeStore.error


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        pytest.param(RuntimeError("Connection reset by peer"), "store", id="transient"),
        pytest.param(ValueError("invalid timeout"), "unsupported", id="deterministic"),
    ],
)
def test_connecting_to_the_store_says_what_its_failure_is(
    monkeypatch: pytest.MonkeyPatch, error: Exception, outcome: str
) -> None:
    monkeypatch.setattr(_store, "TCPStore", FakeStore)
    monkeypatch.setattr(FakeStore, "error", error)
    with pytest.raises((AttemptFailed, Unsupported)) as caught:
        _store.connect_store("10.0.0.9", 29500, timeout=1.0)
    if outcome == "unsupported":
        assert isinstance(caught.value, Unsupported) and caught.value.cause is error
    else:
        assert isinstance(caught.value, AttemptFailed) and caught.value.kind == "store"
        assert "cannot connect to the store at 10.0.0.9:29500: RuntimeError: Connection reset" in caught.value.detail
    assert caught.value.__cause__ is error


def test_rank_0_accepts_an_address_of_this_host_or_one_routed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    infos = [(int(socket.AF_INET), "10.0.0.9"), (int(socket.AF_INET), "10.0.0.10")]
    monkeypatch.setattr(_store, "binds", lambda ip: ip == "10.0.0.10")
    monkeypatch.setattr(_store, "_routes_here", lambda family, ip, port: pytest.fail("bound: no routing test"))
    _store.check_hosting_addr(MASTER, infos)
    monkeypatch.setattr(_store, "binds", lambda ip: False)
    monkeypatch.setattr(_store, "_routes_here", lambda family, ip, port: ip == "10.0.0.10")  # a NAT, a service IP
    _store.check_hosting_addr(MASTER, infos)
    monkeypatch.setattr(_store, "_routes_here", lambda family, ip, port: False)
    with pytest.raises(MasterUnreachableError) as raised:
        _store.check_hosting_addr(MASTER, infos)
    assert "10.0.0.9" in str(raised.value) and "10.0.0.10" in str(raised.value)


def test_rank_0_with_an_unresolvable_address_fails_as_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    def unresolved(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolved)
    with pytest.raises(AttemptFailed) as raised:
        _store.host(MASTER, end=time.monotonic() + 5.0)
    assert raised.value.kind == "dns" and "MASTER_ADDR='10.0.0.9' does not resolve" in raised.value.detail


class Probes:
    """Scripted probe results, one per call, the last repeated."""

    def __init__(self, *kinds: ProbeKind) -> None:
        self.kinds = list(kinds)
        self.calls = 0

    def __call__(self, host: str, port: int, timeout: float, *, handshake_timeout: float) -> ProbeResult:
        kind = self.kinds[min(self.calls, len(self.kinds) - 1)]
        self.calls += 1
        return ProbeResult(kind, f"saw {kind}", 0.0)


def test_a_client_connects_once_a_probe_meets_a_store(monkeypatch: pytest.MonkeyPatch) -> None:
    probes, connected = Probes("refused", "refused", "tcpstore"), []
    monkeypatch.setattr(_store, "probe", probes)
    monkeypatch.setattr(_store, "connect_store", lambda host, port, *, timeout: connected.append((host, port)))
    grace = Grace(foreign=10.0)
    _store.connect(MASTER, end=time.monotonic() + 10.0, grace=grace, rng=random.Random(0))
    assert probes.calls == 3 and connected == [("10.0.0.9", 29500)]


def test_a_client_whose_probes_fail_past_the_grace_raises_the_specific_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store, "probe", Probes("unreachable"))
    with pytest.raises(MasterUnreachableError, match="has no route"):
        _store.connect(
            MASTER, end=time.monotonic() + 10.0, grace=Grace(foreign=10.0, unreachable=0.0), rng=random.Random(0)
        )


def test_a_client_out_of_time_fails_with_what_it_last_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store, "probe", Probes("refused", "error"))
    with pytest.raises(AttemptFailed) as raised:
        _store.connect(MASTER, end=time.monotonic() + 0.2, grace=Grace(foreign=10.0), rng=random.Random(0))
    assert raised.value.kind == "store" and raised.value.detail == "10.0.0.9:29500: saw error"  # "error" is "store"
