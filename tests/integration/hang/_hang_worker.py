"""A rank for the hang verdict tests: setup(), one all_reduce together, then the spec's fault.

argv: a JSON spec. ``dir``: the test's tmp dir; ``mode``: ``sleep`` (rank ``culprit`` sleeps ``hold`` s in its
own ``load_batch`` while the others all_reduce), ``stop`` (the culprit SIGSTOPs itself there; the test resumes
it), ``gil`` (the culprit holds the GIL ``hold`` s in one C call there), ``desync`` (ranks 0 and 1 all_reduce,
the others wait for a broadcast from rank 0), ``loop`` (every rank steps ``base`` s of its own work then one
all_reduce, the culprit ``slow`` times longer, for ``duration`` s), ``subgroup`` (ranks 0 and 1 all_reduce on
the group {0, 1, 2} while its member rank ``culprit`` sleeps in ``load_batch`` and rank 3, not a member, in
``evaluate``). ``hang_after`` and ``on_hang`` go to setup().
Each rank writes ``entered<rank>`` (the wall clock as it enters the collective that waits) and the first hang
verdict distinit logs, with its time, to ``verdict<rank>.json``.
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


def _put(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all: the test polls for the name, then reads it (a bare write_text shows
    the name before its bytes, and a reader in that gap got an empty file)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


class _Verdicts(logging.Handler):
    def __init__(self, where: Path) -> None:
        super().__init__()
        self.where = where

    def emit(self, record: logging.LogRecord) -> None:
        info = getattr(record, "distinit", {})
        path = self.where / f"verdict{info.get('rank')}.json"
        if info.get("event") == "hang.verdict" and not path.exists():
            _put(path, json.dumps({"at": record.created, "message": record.getMessage()}))
        if info.get("event") == "hang.abort":
            _put(self.where / f"abort{info.get('rank')}.json", json.dumps({"at": record.created}))


def load_batch(spec: dict[str, object], rank: int) -> None:
    """The culprit's own code: where the verdict must find it."""
    mode, hold = spec["mode"], float(spec.get("hold", 0))  # type: ignore[arg-type]
    if mode == "sleep":
        time.sleep(hold)
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "gil":
        ctypes.PyDLL(None).sleep(int(hold))  # libc's sleep, keeping the GIL: no thread of this process runs


def evaluate(seconds: float) -> None:
    """A bystander's own code: not in the group the others wait on, so never waited for."""
    time.sleep(seconds)


def main() -> None:
    spec = json.loads(sys.argv[1])
    where = Path(spec["dir"])
    log = logging.getLogger("distinit")
    log.addHandler(_Verdicts(where))
    debug = logging.FileHandler(where / f"debug{os.environ['RANK']}.log")
    debug.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    log.addHandler(debug)
    log.setLevel(logging.DEBUG)
    result = distinit.setup(
        "gloo",
        deadline=60,
        attempt_timeout=30,
        hang_after=spec.get("hang_after"),
        on_hang=spec.get("on_hang", "report"),
    )
    rank = result.env.rank
    _put(where / f"ready{rank}", str(os.getpid()))
    end = time.monotonic() + 180
    while not (where / "go").exists():
        if time.monotonic() > end:
            raise SystemExit("no go from the test within 180 s")
        time.sleep(0.02)
    tensor = torch.ones(1)
    dist.all_reduce(tensor)  # together once: every rank is past setup() and in step
    mode = spec["mode"]
    if mode == "loop":
        stop = time.monotonic() + float(spec["duration"])
        base = float(spec["base"]) * (float(spec["slow"]) if rank == spec["culprit"] else 1.0)
        steps = 0
        while True:
            time.sleep(base)  # this rank's own work
            # the step's collective also says whether this rank's time is up: every rank stops after the same
            # step (a rank stopping on its own clock would leave the others in a collective it never joins)
            done = torch.tensor([1.0 if time.monotonic() >= stop else 0.0])
            dist.all_reduce(done, op=dist.ReduceOp.MAX)
            steps += 1
            if done.item() > 0:
                break
        _put(where / f"steps{rank}", str(steps))
    elif mode == "subgroup":
        group = dist.new_group([0, 1, 2])  # every rank creates it; rank 3 is not in it
        if rank == spec["culprit"]:
            load_batch({"mode": "sleep", "hold": spec["hold"]}, rank)
        elif rank == 3:
            evaluate(float(spec["hold"]))
        else:
            _put(where / f"entered{rank}", repr(time.time()))
        if rank != 3:
            dist.all_reduce(tensor, group=group)
    elif mode == "desync":
        _put(where / f"entered{rank}", repr(time.time()))
        if rank < 2:
            dist.all_reduce(tensor)
        else:
            dist.broadcast(tensor, 0)
    else:
        if rank == spec["culprit"]:
            load_batch(spec, rank)
        else:
            _put(where / f"entered{rank}", repr(time.time()))
        dist.all_reduce(tensor)
        assert tensor.item() == dist.get_world_size() ** 2, tensor
    distinit.teardown()
    (where / f"done{rank}").touch()


if __name__ == "__main__":
    main()
