"""distinit on a torch without numpy: torch does not require it, so neither may we.

A clean ``pip install distinit`` gets torch without numpy, where ``Tensor.numpy()`` raises ``RuntimeError:
Numpy is not available``. The identity exchange of ``setup()`` and the doctor's JSON all_gather once read
their bytes that way (``make dist-check`` found it). Here two real ranks run both with numpy unimportable.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RANK = """
import sys
sys.modules["numpy"] = None  # what a clean install looks like to torch: `import numpy` fails
import distinit
from distinit.doctor._exchange import gather_json
ctx = distinit.setup(backend="gloo", deadline=60)
docs = gather_json({"rank": ctx.env.rank}, world_size=ctx.env.world_size, timeout=30)
print("RESULT", ctx.env.node_rank, ctx.env.local_world_size, docs)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(180)
def test_setup_and_the_doctor_exchange_work_without_numpy(tmp_path: Path) -> None:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        out = (tmp_path / f"rank{rank}.txt").open("w")
        procs.append((subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=out, stderr=out), out))
    try:
        for proc, out in procs:
            proc.wait(timeout=150)
            out.close()
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    for rank, (proc, _) in enumerate(procs):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        assert proc.returncode == 0, text[-3000:]
        result = next(line for line in text.splitlines() if line.startswith("RESULT"))
        node_rank, local_world_size, docs = result.split(" ", 3)[1:]
        assert (node_rank, local_world_size) == ("0", "2")
        assert json.loads(docs.replace("'", '"')) == [{"rank": 0}, {"rank": 1}]
