"""The hosting check for a MASTER_ADDR mistake, against this host's real sockets: an address of this host is
accepted, another is refused with the reason and the fix.

Binds sockets (a free port, then the check's own listener and connect on it); the pure fail-fast diagnoses are
in ``tests/unit/init/test_fail_fast.py``.
"""

from __future__ import annotations

import socket

import pytest

from distinit.errors import RendezvousError
from distinit.init._store import Master, check_hosting_addr


def test_hosting_check_accepts_this_host_and_refuses_another() -> None:
    check_hosting_addr(Master(addr="127.0.0.1", port=0, rank=0), [(socket.AF_INET, "127.0.0.1")])
    with socket.socket() as sock:  # a free port for the routing test
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    master = Master(addr="192.0.2.1", port=port, rank=0)
    with pytest.raises(RendezvousError, match="is not an address of this host") as info:
        check_hosting_addr(master, [(socket.AF_INET, "192.0.2.1")])
    assert socket.gethostname() in str(info.value) and info.value.fix
