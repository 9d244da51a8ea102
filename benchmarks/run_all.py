"""Run every capability benchmark in turn (``make bench``); each prints its own side-by-side table.

Benchmarks compare distinit with the torch baseline in the same run and write their results under
``benchmarks/results/``. They are never run as timed tests. Pass names to run a subset:
``python benchmarks/run_all.py testing init``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: One script per capability, in the order the issues build on each other.
#: cuda: skipped without a GPU.
ORDER = ("testing", "init", "watchdog", "watchdog_routes", "broadcast", "doctor", "torchrun", "import", "scale", "cuda")
#: A whole benchmark script must finish within this many seconds.
LIMIT_S = 1800


def main(names: list[str]) -> int:
    """Run the named benchmarks (all when empty); return the number that failed."""
    failed = 0
    for name in names or list(ORDER):
        script = HERE / f"bench_{name}.py"
        if not script.exists():
            print(f"== {name}: {script.name} not found", flush=True)
            failed += 1
            continue
        print(f"== {name}: {script.name}", flush=True)
        started = time.monotonic()
        try:
            status = subprocess.run([sys.executable, str(script)], timeout=LIMIT_S).returncode
        except subprocess.TimeoutExpired:
            status = -1
            print(f"== {name}: killed after {LIMIT_S} s", flush=True)
        print(f"== {name}: exit {status} in {time.monotonic() - started:.0f} s", flush=True)
        failed += status != 0
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
