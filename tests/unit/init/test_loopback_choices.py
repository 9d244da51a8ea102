"""init/_loopback.py's two remaining choices, with the host's facts given: a host name gloo cannot read, and
whether the loopback trap is set here (gloo, a world of several ranks, a loopback address, a world on several
hosts). The host's own lookups (``advertised``, ``world_spans_hosts``, the routes) are replaced where the module
makes them; the pure parts they feed are in ``test_loopback.py``.
"""

from __future__ import annotations

import pytest

from distinit.env import DistEnv
from distinit.errors import RendezvousError
from distinit.init import _loopback
from distinit.init._loopback import Advertised

WORLD = DistEnv(rank=2, local_rank=0, world_size=4, launcher="torchrun", master_addr="gpu-a", master_port=29500)
TRAPPED = Advertised(hostname="gpu-b", resolved=("127.0.1.1",), address="127.0.1.1", source="hostname")
ROUTED = Advertised(hostname="gpu-b", resolved=("10.0.0.6",), address="10.0.0.6", source="hostname")


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose gloo reads names of up to 9 bytes, with one interface, eth0, on the route to the master."""
    monkeypatch.setattr(_loopback, "host_name_max", lambda: 10)
    monkeypatch.setattr(_loopback, "route_interface", lambda addr, port: "eth0")
    monkeypatch.setattr(_loopback, "interfaces", lambda: (("eth0", "10.0.0.6"),))


@pytest.mark.usefixtures("host")
def test_a_host_name_as_long_as_gloos_buffer_is_refused_with_the_interface_to_set() -> None:
    _loopback.check_hostname("gloo", WORLD, {}, hostname="node-0001")  # 9 bytes: fits with its end
    with pytest.raises(RendezvousError) as raised:
        _loopback.check_hostname("gloo", WORLD, {}, hostname="node-00001")
    assert "10 bytes long ('node-00001')" in raised.value.what and "eth0" in raised.value.fix
    with pytest.raises(RendezvousError):
        _loopback.check_hostname("gloo", WORLD, {}, hostname="nöde-0001")  # 10 bytes in UTF-8


@pytest.mark.usefixtures("host")
@pytest.mark.parametrize(
    ("backend", "environ"),
    [
        pytest.param("nccl", {}, id="nccl-reads-no-name"),
        pytest.param("gloo", {"GLOO_SOCKET_IFNAME": "eth0"}, id="an-interface-named"),
    ],
)
def test_a_long_host_name_matters_only_to_gloo_without_an_interface(backend: str, environ: dict[str, str]) -> None:
    _loopback.check_hostname(backend, WORLD, environ, hostname="a-very-long-host-name.example.org")


@pytest.mark.parametrize(
    ("backend", "world_size", "address", "evidence", "trapped"),
    [
        pytest.param("gloo", 4, TRAPPED, "the launcher says 2 nodes", True, id="trap"),
        pytest.param("nccl", 4, TRAPPED, "the launcher says 2 nodes", False, id="nccl-advertises-nothing-here"),
        pytest.param("gloo", 1, TRAPPED, "the launcher says 2 nodes", False, id="a-world-of-one"),
        pytest.param("gloo", 4, ROUTED, "the launcher says 2 nodes", False, id="a-routable-address"),
        pytest.param("gloo", 4, None, "the launcher says 2 nodes", False, id="an-interface-without-ipv4"),
        pytest.param("gloo", 4, TRAPPED, None, False, id="all-on-this-host"),
    ],
)
def test_the_loopback_trap_needs_gloo_a_loopback_address_and_several_hosts(
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    world_size: int,
    address: Advertised | None,
    evidence: str | None,
    trapped: bool,
) -> None:
    monkeypatch.setattr(_loopback, "advertised", lambda environ: address)
    monkeypatch.setattr(_loopback, "world_spans_hosts", lambda world: evidence)
    world = DistEnv.model_validate({**WORLD.model_dump(), "world_size": world_size, "rank": 0})
    found = _loopback.loopback_trap(backend, world, {})
    assert found == ((address, evidence) if trapped else None)
