"""The reachability probe against real listeners on loopback, and torch's leaked group counter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist
from init_launch import free_port

from distinit._net import port_holder, probe


@pytest.mark.timeout(30)
def test_probe_refused() -> None:
    seen = probe("127.0.0.1", free_port(), 2.0)
    assert seen.kind == "refused" and seen.elapsed < 1


@pytest.mark.timeout(30)
def test_probe_recognises_a_tcpstore() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    seen = probe("127.0.0.1", store.port, 2.0)
    assert seen.kind == "tcpstore"
    store.set("still", "works")  # the probe left the server healthy
    assert store.get("still") == b"works"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("behaviour", ["hold", "close", "garbage"])
def test_probe_recognises_a_foreign_listener(behaviour: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        if behaviour == "garbage":
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        if behaviour in ("close", "garbage"):
            conn.close()
        else:
            threading.Event().wait(3)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        seen = probe("127.0.0.1", port, 2.0, handshake_timeout=1.0)
        assert seen.kind == "foreign", seen
        assert seen.elapsed < 2
        assert port_holder(port) is not None and f"pid {os.getpid()}" in (port_holder(port) or "")
    finally:
        thread.join(5)
        server.close()


@pytest.mark.timeout(60)
def test_torch_leaks_the_group_counter_and_reset_repairs_it() -> None:
    """pytorch/pytorch#46561: a failed init leaves _world.group_count bumped; our reset undoes it.

    Runs in a subprocess so the test process keeps a clean torch.distributed state."""
    script = textwrap.dedent(
        """
        from datetime import timedelta
        import torch.distributed as dist
        from distinit.init._form import reset_group_counter
        world = dist.distributed_c10d._world
        assert world.group_count == 0
        try:  # rank 0 of 2 on a private store: the peer never comes, init fails
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=2, timeout=timedelta(seconds=1))
        except Exception:
            pass
        else:
            raise SystemExit("init unexpectedly succeeded")
        leaked = world.group_count
        assert leaked == 1, leaked
        assert reset_group_counter() is True
        assert world.group_count == 0
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        assert dist.distributed_c10d._get_default_group().group_name == "0"
        assert reset_group_counter() is False  # live groups: never touched
        dist.destroy_process_group()
        print("LEAK", leaked)
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LEAK 1" in done.stdout
