"""A FileTimer worker for the drop-in tests: `python ft_worker.py CLIENT FIFO AFTER [SIGNAL]`.

CLIENT is ``torch`` (an unchanged ``torch.distributed.elastic.timer`` client) or ``distinit`` (the drop-in,
``distinit.watchdog.elastic``). The worker configures a client on FIFO, enters ``expires(after=AFTER)``,
prints one JSON line ({"ready": true, "pid": ...}) and hangs there. Under torchrun (FIFO ``-``), the FIFO is
``$TORCHELASTIC_TIMER_FILE``; restart 0 hangs and restart 1 completes its region and exits 0.
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
with timer.expires(after=after, scope=f"step-attempt{attempt}"):
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid(), "attempt": attempt}) + "\n")
    sys.stdout.flush()
    if attempt == 0:
        time.sleep(600)  # hang:file-timer
