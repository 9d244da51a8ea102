"""Local checks against the real machine that need a process or a socket: stale /dev/shm-like entries of a
process that exited (a real child) and the doctor's listener (binds a port, answers probes, then refuses).

The checks without either are in ``tests/unit/doctor/test_doctor_local.py``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from distinit.doctor._clock import measure
from distinit.doctor._listener import Listener
from distinit.doctor._reach import classify, probe, probe_all, transfer
from distinit.doctor._shm import check_shm, stale_files


def test_stale_segments_are_listed_and_live_ones_are_not(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=60
    )
    (tmp_path / "nccl-abandoned").write_bytes(b"x")
    (tmp_path / f"torch_{dead.stdout.strip()}_1_0").write_bytes(b"x")
    (tmp_path / f"torch_{os.getpid()}_1_0").write_bytes(b"x")
    (tmp_path / "unrelated").write_bytes(b"x")
    with open(tmp_path / "nccl-in-use", "wb") as held:
        held.write(b"x")
        held.flush()
        stale = stale_files(str(tmp_path))
    assert stale == ["nccl-abandoned", f"torch_{dead.stdout.strip()}_1_0"]
    check = check_shm(local_world_size=1, shm=str(tmp_path))
    assert check.status == "warn" and "nccl-abandoned" in check.summary


def test_listener_answers_ping_time_and_bulk_and_errors_are_classified() -> None:
    listener = Listener("127.0.0.1")
    try:
        endpoint = ("127.0.0.1", listener.port)
        assert probe(endpoint, timeout=2) is None
        assert probe_all([endpoint, endpoint], timeout=2) == [None, None]
        offset = measure(endpoint, timeout=2)
        assert isinstance(offset, tuple) and abs(offset[0]) < 0.5
        rate = transfer(endpoint, size_bytes=8 << 20, timeout=10)
        assert isinstance(rate, float) and rate > 0
    finally:
        listener.close()
    assert probe(endpoint, timeout=2) == "refused"
    assert classify(TimeoutError()) == "timeout"
    assert classify(OSError(errno.EHOSTUNREACH, "No route to host")) == "no route"
    assert classify(OSError(errno.EACCES, "[pair.cc:1] Permission denied")) == "[pair.cc:1] Permission denied"
