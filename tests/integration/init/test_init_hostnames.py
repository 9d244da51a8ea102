"""Host names at the kernel's limits (issue 33): torch's gloo cannot read one of 64 bytes; distinit says so at once.

Each rank runs in a UTS namespace of its own (root), named by a small Python (``hostname(1)`` refuses non-ASCII)
that then execs the rank. Naming a live rank with such a host name after setup() is in test_init_culprit.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from init_launch import Launcher, free_port


def _uts_available() -> str | None:
    if os.geteuid() != 0:
        return "naming a host needs root (a UTS namespace per rank)"
    if shutil.which("unshare") is None:
        return "needs unshare(1) from util-linux"
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"unshare --uts failed: {probe.stderr.decode(errors='replace')}"


_REASON = _uts_available()
pytestmark = [pytest.mark.skipif(_REASON is not None, reason=_REASON or ""), pytest.mark.timeout(240)]

#: The kernel's limit (__NEW_UTS_LEN): 64 bytes. torch's gloo reads the name into 64 bytes, its end included.
LONGEST = "n" * 63 + "x"


def test_a_64_byte_host_name_fails_at_once_naming_the_fix_and_gloo_socket_ifname_works(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path)
    try:
        port = free_port()
        ranks = [launcher.start(r, 2, port, kwargs={"deadline": 60}, hostname=LONGEST) for r in range(2)]
        for res in (rank.result(60) for rank in ranks):
            assert not res["ok"] and res["error"] == "RendezvousError", res
            message = str(res["message"])
            assert "64 bytes long" in message and "File name too long" in message, message
            assert "GLOO_SOCKET_IFNAME=lo" in message and "Not retried" in message, message
            assert res["elapsed"] < 5, res  # a pre-flight check: no attempt, no network
        port = free_port()
        env = {"GLOO_SOCKET_IFNAME": "lo"}
        ranks = [
            launcher.start(r, 2, port, kwargs={"deadline": 60}, hostname=LONGEST, env=env, name=f"ifname{r}")
            for r in range(2)
        ]
        for res in (rank.result(90) for rank in ranks):
            assert res["ok"], res
    finally:
        launcher.stop_all()
