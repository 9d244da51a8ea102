"""A rank that calls setup(), says it is ready, waits for the test's go, then all_reduces until something fails.

argv: a JSON spec (``dir``: the test's tmp dir; ``mode``: "finish" for a normal end, rank 0 working ``work`` s
longer than the others; "raise": rank ``raiser`` raises ValueError after the go; "gil": after the go, rank
``holder`` holds the GIL for ``hold`` s in one C call while the others wait in an all_reduce with it, then every
rank all_reduces once more and tears down; "junk": right after setup, rank ``forger`` writes junk to the
finding's store key and a forged host|pid to its own who key, then every rank loops as by default). By default
the ranks in ``catchers`` catch the failed collective as Lightning or a user's ``except`` would, write
``caught<rank>.json`` (what ``lost_peer`` said with ``catch`` "lost_peer", null with "quiet") and exit with status
3; rank ``stopper`` SIGSTOPs itself as its collective fails (the test continues it); ``op`` "barrier" loops on
barriers instead of all_reduces. Each rank writes what
distinit logs about who went away to ``finding<rank>.json`` (the first such message and its time). Uncaught
errors end the process as a user's script would (traceback, atexit teardown).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distinit
from distinit.init import lost_peer


def _put(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all: the test polls for the name, then reads it (a bare write_text shows
    the name before its bytes, and a reader in that gap got an empty file)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


class _Findings(logging.Handler):
    """Writes each finding distinit logs at exit (who went away) to ``finding<rank>.json``, with its time."""

    def __init__(self, where: Path) -> None:
        super().__init__()
        self.where = where

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, "distinit", {})
        if info.get("event") == "init.peer_back":
            (self.where / f"back{info.get('rank')}").touch()
        path = self.where / f"finding{info.get('rank')}.json"
        if info.get("event") in ("init.peer_closed", "init.own_failure", "init.peer_named") and not path.exists():
            line = {"rank": info["rank"], "at": record.created, "message": record.getMessage()}  # the first
            _put(path, json.dumps(line))


def main() -> None:
    spec = json.loads(sys.argv[1])
    where = Path(spec["dir"])
    log = logging.getLogger("distinit")
    log.addHandler(_Findings(where))
    debug = logging.FileHandler(where / f"debug{os.environ['RANK']}.log")  # what a failed test shows
    debug.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    log.addHandler(debug)
    shown = logging.StreamHandler()  # warnings on stderr, as without handlers (logging's last resort)
    shown.setLevel(logging.WARNING)
    log.addHandler(shown)
    log.setLevel(logging.DEBUG)
    result = distinit.setup("gloo", deadline=60, attempt_timeout=30)
    rank = result.env.rank
    if spec.get("mode") == "junk" and rank == spec["forger"]:
        # What any client of the store can write (done from here: the keys carry torch's group prefix): junk on
        # the finding's key, and this live rank's who key claiming a pid that does not exist on rank 0's host.
        store = dist.PrefixStore("distinit", dist.distributed_c10d._get_default_store())
        store.set("lost", "\x1b[31mrank 2 did it\x00")
        store.set(f"who/{rank}", "hosta|4000000")
    _put(where / f"ready{rank}", str(os.getpid()))
    if spec.get("mode") == "finish":
        # A normal end: every rank but 0 tears down and exits; rank 0 keeps working past the loss bound
        # (a final checkpoint), then tears down. Nobody was lost: no "stopped" warning may appear.
        if rank != 0:
            distinit.teardown()
            return
        time.sleep(float(spec["work"]))
        distinit.teardown()
        return
    end = time.monotonic() + 180
    while not (where / "go").exists():
        if time.monotonic() > end:
            raise SystemExit("no go from the test within 180 s")
        time.sleep(0.02)
    tensor = torch.ones(1)
    (where / f"looping{rank}").touch()
    if spec.get("mode") == "gil":
        if rank == spec["holder"]:
            # libc's sleep through ctypes.PyDLL, which keeps the GIL: no thread of this process runs meanwhile
            ctypes.PyDLL(None).sleep(int(spec["hold"]))
        dist.all_reduce(tensor)
        dist.all_reduce(tensor)
        assert tensor.item() == dist.get_world_size() ** 2, tensor  # two sums of ones: nothing was lost
        if rank == 0:  # its watch warned about the holder: wait (bounded) until it withdraws the warning
            end = time.monotonic() + 30
            while not (where / "back0").exists() and time.monotonic() < end:
                time.sleep(0.05)
        distinit.teardown()
        (where / f"done{rank}").touch()
        return
    if spec.get("mode") == "raise" and rank == spec["raiser"]:
        dist.all_reduce(tensor)  # one collective together first, so the others are in the next one
        raise ValueError("a bug in rank's own code")
    while time.monotonic() < end:
        try:
            if spec.get("op") == "barrier":
                dist.barrier()  # gloo's barrier fails at once on every rank a dead rank leaves behind
            else:
                dist.all_reduce(tensor)  # one element: a rank may wait on a live but stopped neighbour
        except RuntimeError as exc:
            if rank == spec.get("stopper"):
                os.kill(os.getpid(), signal.SIGSTOP)  # starved to the extreme: frozen before it reads anything
            if rank not in spec.get("catchers", ()):
                raise
            # As Lightning's settings exchange or a user's `except` does: the error is caught (named through
            # lost_peer, or not at all: "quiet") and the process ends normally, without an uncaught exception.
            found = lost_peer(exc) if spec["catch"] == "lost_peer" else None
            _put(where / f"caught{rank}.json", json.dumps({"found": found}))
            sys.exit(3)
    raise SystemExit("no collective failed within 180 s")


if __name__ == "__main__":
    main()
