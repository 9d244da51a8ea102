"""A pid namespace of a test's own, for tests that force a pid to be recycled.

Forcing a pid means writing ``/proc/sys/kernel/ns_last_pid``. In the machine's namespace that rewinds the pid
counter of every process on it: the next processes anywhere (another pytest worker's Slurm daemons, a launcher's
ranks) are handed numbers freed moments ago, which any stale pid still held elsewhere then names. A test that runs
as pid 1 of a namespace of its own moves only its own counter and races with nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

#: The command prefix: a new pid namespace (the command is its pid 1) with its own /proc mounted.
UNSHARE_PID = ["unshare", "--pid", "--fork", "--mount-proc"]


def own_pid_namespace_unavailable() -> str | None:
    """Why this machine cannot give a test a pid namespace of its own (None: it can)."""
    if os.geteuid() != 0:
        return "forcing pid reuse needs root (a pid namespace and a writable ns_last_pid)"
    if shutil.which("unshare") is None:
        return "needs unshare(1) from util-linux"
    probe = subprocess.run([*UNSHARE_PID, "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare --pid failed here: {probe.stderr.decode(errors='replace').strip()}"
    return None
