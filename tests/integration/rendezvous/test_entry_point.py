"""The ``torchrun.handlers`` entry point registers whichever side is imported first.

torch's rendezvous package loads every ``torchrun.handlers`` entry point when it is imported. Under torchrun
torch comes first; in a user's script ``distinit.rendezvous`` may come first (``except
AgentRendezvousTimeoutError``). Both orders must leave ``distinit`` in torch's registry (the second once
failed with "partially initialized module 'distinit.rendezvous' has no attribute 'handler'").
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import {first}
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
import distinit.rendezvous
assert "distinit" in rendezvous_handler_registry._registry, sorted(rendezvous_handler_registry._registry)
print("registered")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first", ["distinit.rendezvous", "torch.distributed.elastic.rendezvous"])
def test_the_backend_is_registered_whatever_is_imported_first(first: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(first=first)], capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "registered" in done.stdout
    assert "partially initialized" not in done.stderr
