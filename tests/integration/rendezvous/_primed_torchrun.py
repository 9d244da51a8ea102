"""``torchrun`` that has imported everything before it is told to go: a second agent that joins at once.

argv: ``READY GO torchrun-arguments...``. Imports torchrun (which loads the ``torchrun.handlers`` entry points,
distinit's among them) and the distinit backend, writes READY, waits for the file GO to exist (at most 300 s),
then runs torchrun's ``main`` with the remaining arguments.

Why: a test that kills an agent after the round formed gives the agents a short ``join_timeout`` (the verdict
comes at that timeout), and the first agent's join clock starts as soon as it is up. A second agent started
only then spends seconds importing torch before it joins; on a loaded machine that took longer than the
timeout, the round never formed, and the test failed without testing anything. Started primed, the second
agent joins within milliseconds of ``go``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch.distributed.run as torchrun

import distinit.rendezvous  # noqa: F401  (the backend the entry point registers; imported before GO)

ready, go, *arguments = sys.argv[1:]
Path(ready).write_text(str(os.getpid()))
deadline = time.monotonic() + 300
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit(f"{go} never appeared")
    time.sleep(0.01)
sys.argv = ["torchrun", *arguments]
sys.exit(torchrun.main())
