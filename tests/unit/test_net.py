"""distinit._net: the host's network facts, on loopback only (no namespace, no other host): the pure address rules
and the interfaces read from the kernel (no socket bound).

What binds, listens, probes or runs a fresh interpreter is in ``tests/integration/test_net_live.py``.
"""

from __future__ import annotations

import pytest

from distinit import _net


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        pytest.param("127.0.1.1", True, id="debian-127.0.1.1"),
        pytest.param("127.0.0.1", True, id="127.0.0.1"),
        pytest.param("::1", True, id="ipv6-loopback"),
        pytest.param("::ffff:127.0.1.1", True, id="ipv4-mapped-loopback"),
        pytest.param("10.0.0.5", False, id="private"),
        pytest.param("fe80::1%eth0", False, id="link-local-with-scope"),
        pytest.param("node07", False, id="a-name"),
        pytest.param("", False, id="empty"),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert _net.is_loopback(address) is loopback


def test_interfaces_exclude_loopback() -> None:
    assert all(not _net.is_loopback(ip) for _, ip in _net.interfaces())
    assert _net.interface_ipv4("lo") == "127.0.0.1"
    assert _net.interface_ipv4("no-such-interface") is None
