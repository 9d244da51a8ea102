"""A FileTimer worker for the drop-in tests: `python ft_worker.py CLIENT FIFO AFTER [SIGNAL]`.

CLIENT is ``torch`` (an unchanged ``torch.distributed.elastic.timer`` client) or ``distinit`` (the drop-in,
``distinit.watchdog.elastic``). The worker configures a client on FIFO, enters ``expires(after=AFTER)``,
prints one JSON line ({"ready": true, "pid": ..., "deadline": ..., "stack_files": [...]}) and hangs there.
``deadline`` is ``time.time()`` before the region + AFTER (at or before the timer's expiration time);
``stack_files`` are the ``*.stack`` files beside FIFO while the region runs. Under torchrun (FIFO ``-``), the
FIFO is ``$TORCHELASTIC_TIMER_FILE``; restart 0 hangs and restart 1 completes its region and exits 0. With
``FT_WORKER_GATE=1`` it first prints {"pid": ..., "gate": true} and waits for a line on stdin.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

kind, fifo, after = sys.argv[1], sys.argv[2], float(sys.argv[3])
sig = int(sys.argv[4]) if len(sys.argv) > 4 else int(signal.SIGKILL)
if kind == "torch":
    import torch.distributed.elastic.timer as timer
else:
    import distinit.watchdog.elastic as timer  # type: ignore[no-redef]

if fifo == "-":
    fifo = os.environ["TORCHELASTIC_TIMER_FILE"]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
timer.configure(timer.FileTimerClient(fifo, signal=sig))
if os.environ.get("FT_WORKER_WARMUP") == "1":  # one region that ends in time, before the gate
    with timer.expires(after=60, scope="warmup"):
        pass
if os.environ.get("FT_WORKER_GATE") == "1":
    sys.stdout.write(json.dumps({"pid": os.getpid(), "gate": True}) + "\n")
    sys.stdout.flush()
    if not sys.stdin.readline():  # the test went away: do not hang for it
        sys.exit(3)
before = time.time()
with timer.expires(after=after, scope=f"step-attempt{attempt}"):
    folder, name = os.path.split(os.path.abspath(fifo))
    stacks = sorted(p for p in os.listdir(folder) if p.startswith(name) and p.endswith(".stack"))
    ready = {"ready": True, "pid": os.getpid(), "attempt": attempt, "deadline": before + after, "stack_files": stacks}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    if attempt == 0:
        time.sleep(600)  # hang:file-timer
