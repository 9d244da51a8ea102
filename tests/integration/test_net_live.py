"""distinit._net against this host's real sockets and fresh interpreters, on loopback only (no namespace, no other
host): which addresses bind, what a probe of a listener or a closed port says, who holds a listening port, and that
the leaf (and the torchrun backend) import no more than they should, in a child process.

The pure address rules and the interfaces read from the kernel are in ``tests/unit/test_net.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from distinit import _net


def test_binds_an_address_of_this_host_only() -> None:
    assert _net.binds("127.0.0.1")
    assert not _net.binds("192.0.2.1")  # TEST-NET-1: never an address of this host


def test_probe_classifies_refused_and_a_foreign_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.listen(1)
        seen = _net.probe("127.0.0.1", port, 5.0, handshake_timeout=0.3)  # accepted by the backlog, never answered
        assert seen.kind == "foreign", seen
    assert _net.probe("127.0.0.1", port, 5.0).kind == "refused"
    assert _net.probe("no-such-host.invalid", 1, 5.0).kind == "dns"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="port_holder reads /proc (Linux only)")
def test_port_holder_names_the_listening_process() -> None:
    # The listener is this process's own socket, so its fd is always readable here: the holder is named.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.listen(1)
        holder = _net.port_holder(port)
    assert holder is not None
    assert holder.startswith(f"pid {os.getpid()} ("), holder
    assert "python" in holder.lower() or "pytest" in holder.lower(), holder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="port_holder reads /proc (Linux only)")
def test_port_holder_of_a_bound_but_not_listening_port_is_none() -> None:
    # Only a listening socket (state 0A) holds a port for the store: a bound, unlistened one is not named.
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        assert _net.port_holder(bound.getsockname()[1]) is None


def test_a_leaf_without_torch_or_pydantic() -> None:
    code = "import sys, distinit._net, distinit._board; sys.exit(bool({'torch', 'pydantic'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_the_torchrun_backend_imports_no_init() -> None:
    code = (
        "import sys, distinit.rendezvous; "
        "sys.exit(any(m == 'pydantic' or m.startswith('distinit.init') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
