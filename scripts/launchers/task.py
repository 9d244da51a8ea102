#!/usr/bin/env python3
"""Per-task wrapper started by a real launcher: record the task's environment, run a command.

``task.py OUTDIR [-- COMMAND...]`` writes ``OUTDIR/task-<pid>.json`` holding

* ``env``: the launcher-related variables this task received (see ``LAUNCHER_PREFIXES`` and
  ``LAUNCHER_NAMES``), exactly as the launcher set them;
* ``truth``: where the task really runs, from sources the resolver under test does not read
  (``SLURMD_NODENAME``, the fake rsh agent's ``DISTINIT_FAKE_HOST``, hydra's
  ``MPIR_CVAR_CH3_INTERFACE_HOSTNAME``, the torchrun agent tag ``DISTINIT_AGENT``);
* ``rc``, ``stdout``, ``stderr`` of COMMAND when one is given (e.g. ``distinit env --json --check``).

It exits with COMMAND's status. File descriptors stay open for COMMAND (hydra's ``PMI_FD``).
Only the standard library is used, so any Python can run it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid

LAUNCHER_PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_LOCAL",
    "HYDRA_",
    "PALS_",
    "TORCHELASTIC_",
    "ROLE_",
)
LAUNCHER_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
TRUTH_NAMES = {
    "slurmd_nodename": "SLURMD_NODENAME",
    "fake_host": "DISTINIT_FAKE_HOST",
    "hydra_host": "MPIR_CVAR_CH3_INTERFACE_HOSTNAME",
    "agent": "DISTINIT_AGENT",
}


def is_launcher_variable(name: str) -> bool:
    """True for the variables a capture keeps."""
    return name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES)


def launcher_env(environ: dict[str, str]) -> dict[str, str]:
    """Filter an environment down to launcher-related variables, sorted by name."""
    return {k: environ[k] for k in sorted(environ) if is_launcher_variable(k)}


def main(argv: list[str]) -> int:
    """Run the wrapper; see the module docstring."""
    if not argv:
        print("usage: task.py OUTDIR [-- COMMAND...]", file=sys.stderr)
        return 64
    outdir, rest = argv[0], argv[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    environ = dict(os.environ)
    record: dict[str, object] = {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "env": launcher_env(environ),
        "truth": {key: environ.get(var) for key, var in TRUTH_NAMES.items()},
        "command": rest,
    }
    rc = 0
    if rest:
        start = time.monotonic()
        proc = subprocess.run(rest, capture_output=True, text=True, close_fds=False, check=False)
        rc = proc.returncode
        record.update(rc=rc, stdout=proc.stdout, stderr=proc.stderr, seconds=round(time.monotonic() - start, 3))
    path = os.path.join(outdir, f"task-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
