"""What every benchmark records about the machine it ran on, so a figure can say how loaded it was.

The machines these benchmarks run on are shared: a result without the load average beside it cannot be
compared with another. ``machine_facts()`` is called at the end of a run (and ``load_average()`` also at
the start where a script wants both) and stored under ``"machine_facts"`` in each results JSON.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_facts(*, load_at_start: list[float] | None = None) -> dict[str, Any]:
    """CPUs, platform, versions, date, command and load averages (at the end, and at the start if given)."""
    try:
        import torch

        torch_version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        torch_version, gpu = None, None
    facts: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch_version,
        "gpu": gpu,
        "load_average_at_end": load_average(),
    }
    if load_at_start is not None:
        facts["load_average_at_start"] = load_at_start
    return facts


def spawn_world(target: Callable[..., None], world: int, extra: tuple[Any, ...], *, limit_s: float, what: str) -> Any:
    """Run ``target(rank, world, store_path, *extra, queue)`` in ``world`` spawned processes; return rank 0's result.

    Each worker initialises its group from the file store at ``store_path`` and puts its result on ``queue``
    (rank 0's is returned). A worker that exits non-zero, or no result within ``limit_s`` seconds, kills them
    all and raises ``RuntimeError`` naming ``what``: a dead worker must not leave the benchmark waiting.
    """
    import torch.multiprocessing as mp  # only here: the facts above stay importable without torch

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=target, args=(r, world, store, *extra, queue)) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + limit_s
        while True:
            try:
                result = queue.get(timeout=2)
                break
            except Exception:  # queue.Empty
                if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                    for p in procs:
                        p.kill()
                    raise RuntimeError(f"{what} failed (see worker output)") from None
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
    return result
