"""One rank of a ``via=`` scenario (shared memory or file transport), run as a real process by the tests.

``python via_worker.py SCENARIO`` with env:// variables; prints one ``RESULT {json}`` line. Faults are
injected in this process only (DISTINIT_TEST_FAULT), by wrapping distinit's own transport steps.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distinit.broadcast import broadcast_module, broadcast_state_dict, broadcast_tensor
from distinit.broadcast._transport import file as _file
from distinit.broadcast._transport import shm as _shm
from distinit.errors import BroadcastError

TIMEOUT = float(os.environ.get("VIA_TIMEOUT", "20"))
MEET = os.environ.get("VIA_MEET", "")  # a directory where a rank and a test's attacker meet, by marker files


class Events(logging.Handler):
    """Keeps the ``extra={"distinit": ...}`` facts of every distinit.broadcast record."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        facts = getattr(record, "distinit", None)
        if isinstance(facts, dict) and facts.get("event") != "broadcast.call":
            self.events.append({**facts, "level": record.levelname, "message": record.getMessage()})


def segments() -> list[str]:
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith("distinit-bc-"))


def payload(nbytes: int, seed: int = 0) -> torch.Tensor:
    return torch.arange(nbytes // 4, dtype=torch.int32) + seed


def state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(700, 700, generator=g),
        "half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "mask": torch.randint(0, 2, (17,), generator=g).bool(),
        "codes": torch.randint(0, 60000, (5,), generator=g).to(torch.uint16),
        "empty": torch.empty(0, 3),
        "step": torch.tensor(seed),
    }


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k].view(-1).view(torch.uint8),
                                                                             b[k].view(-1).view(torch.uint8))
        for k in a
    )  # fmt: skip


def failure(exc: BaseException, started: float) -> dict[str, Any]:
    return {
        "error": type(exc).__name__,
        "field": getattr(exc, "field", None),
        "ranks": list(getattr(exc, "ranks", ())),
        "text": str(exc).splitlines()[0],
        "elapsed": time.monotonic() - started,
    }


def roundtrip(rank: int, via: str, **kw: Any) -> dict[str, Any]:
    """Tensor, state dict (allocated, zero-copy, in place) and module through ``via``; every check named."""
    checks: dict[str, bool] = {}
    ref = payload(6 << 20)
    checks["tensor"] = torch.equal(broadcast_tensor(ref if rank == 0 else None, via=via, timeout=TIMEOUT, **kw), ref)
    sd = state_dict(0)
    got = broadcast_state_dict(sd if rank == 0 else None, via=via, timeout=TIMEOUT, **kw)
    checks["state_dict allocated"] = same(got, sd)
    if via == "shm":
        got = broadcast_state_dict(sd if rank == 0 else None, via=via, zero_copy=True, timeout=TIMEOUT)
        checks["state_dict zero_copy"] = same(got, sd)
        if rank != 0:  # src got its own tensors back; a receiver's view is copy-on-write: the write stays here
            got["w"].add_(1.0)
            checks["zero_copy write lands in the view"] = bool(torch.equal(got["w"], sd["w"] + 1.0))
    mine = state_dict(rank)
    before = {k: v.data_ptr() for k, v in mine.items()}
    broadcast_state_dict(mine, via=via, timeout=TIMEOUT, **kw)
    checks["state_dict in place"] = same(mine, sd) and all(v.data_ptr() == before[k] for k, v in mine.items())
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(rank))
    broadcast_module(model, via=via, timeout=TIMEOUT, **kw)
    checks["module"] = all(bool((p == 0).all()) for p in model.parameters())
    if via == "shm":  # after a zero-copy receiver wrote into its view, src's data is still what every rank sees
        again = broadcast_state_dict(sd if rank == 0 else None, via=via, zero_copy=True, timeout=TIMEOUT)
        checks["segment untouched by a receiver's write"] = same(again, sd)
    return {"checks": checks}


def scenario(name: str, rank: int, events: Events) -> dict[str, Any]:
    world = dist.get_world_size()
    started = time.monotonic()
    path = os.environ.get("VIA_PATH")
    try:
        if name == "roundtrip-shm":
            return roundtrip(rank, "shm")
        if name == "roundtrip-file":
            return roundtrip(rank, "file", path=path)
        if name == "roundtrip-auto":
            return roundtrip(rank, "auto")
        if name in ("one-tensor", "kill"):
            seed = int(os.environ.get("VIA_SEED", "0"))
            ref = payload(int(os.environ.get("VIA_NBYTES", str(3 << 20))), seed)
            got = broadcast_tensor(ref if rank == 0 else None, via="shm", zero_copy=rank % 2 == 1, timeout=TIMEOUT)
            return {"equal": torch.equal(got, ref), "events": events.events}
        if name == "auto-views":  # 16 MiB, zero_copy: auto takes shm only with >= 4 ranks on a host
            ref = payload(16 << 20)
            got = broadcast_tensor(ref if rank == 0 else None, via="auto", zero_copy=True, timeout=TIMEOUT)
            return {"equal": torch.equal(got, ref), "events": events.events}
        if name == "mismatch":
            ref = payload(1 << 20)
            broadcast_tensor(ref if rank == 0 else None, via="network" if rank == world - 1 else "shm", timeout=TIMEOUT)
            after = broadcast_tensor(ref if rank == 0 else None, timeout=TIMEOUT)  # the group is still usable
            return {"equal": torch.equal(after, ref)}
        if name == "attack":  # src: 16 MiB; rank 1 keeps zero-copy views, rank 2 passes a buffer
            ref = payload(16 << 20)
            mine = None if rank == 1 else (ref if rank == 0 else torch.zeros_like(ref))
            got = broadcast_tensor(mine, via="shm", zero_copy=rank == 1, timeout=TIMEOUT)
            result: dict[str, Any] = {"equal": torch.equal(got, ref), "elapsed": time.monotonic() - started}
            if rank and MEET:  # the attacker tries again now that the call returned; the views must not change
                meet(f"returned-{rank}", "after-done")
                result["equal after"] = torch.equal(got, ref) and int(got.sum()) == int(ref.sum())
            return result
        if name == "file-fault":
            ref = payload(2 << 20)
            buf = torch.zeros_like(ref)
            try:
                broadcast_tensor(ref if rank == 0 else buf, via="file", path=path, timeout=TIMEOUT)
            except BroadcastError as exc:
                files = os.listdir(path) if path and os.path.isdir(path) else []
                return {**failure(exc, started), "untouched": bool((buf == 0).all()), "files": files}
            return {"equal": True}
        if name == "file-keep":
            ref = payload(1 << 20)
            got = broadcast_tensor(ref if rank == 0 else None, via="file", path=path, keep=True, timeout=TIMEOUT)
            return {"equal": torch.equal(got, ref), "files": os.listdir(path)}
        raise ValueError(f"unknown scenario {name!r}")
    except BroadcastError as exc:
        return failure(exc, started)


def inject(fault: str, rank: int) -> None:
    """Wrap one of distinit's own transport steps in this process to cause a real fault."""
    if fault == "kill-after-attach" and rank == 1:
        attach = _shm.Segment.attach

        def attach_then_die(row: list[int], total: int) -> Any:
            result = attach(row, total)
            os.kill(os.getpid(), signal.SIGKILL)
            return result

        _shm.Segment.attach = attach_then_die  # type: ignore[method-assign]
    if fault == "non-dumpable-leader" and rank == 0:  # its /proc/<pid>/fd is then root's: readers need CAP_SYS_PTRACE
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    if fault in ("attack-before-seal", "attack-after-seal", "kill-while-writing") and rank == 0:
        _pause_leader(fault)
    if fault in FILE_ATTACKS and rank == 0:
        write = _file.write

        def write_then_damage(ctx: Any, route: Any, final: str, *args: Any) -> None:
            write(ctx, route, final, *args)
            FILE_ATTACKS[fault](final)

        _file.write = write_then_damage  # type: ignore[assignment]


def meet(mine: str, theirs: str, timeout: float = 60.0) -> None:
    """Write marker ``mine`` (this pid) in MEET, then wait for ``theirs`` (bounded: a lost attacker fails the test)."""
    part = Path(MEET) / f"{mine}.part"  # whole or not at all: a test polls for the name, then reads the pid
    part.write_text(str(os.getpid()))
    os.replace(part, Path(MEET) / mine)
    deadline = time.monotonic() + timeout
    while not (Path(MEET) / theirs).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {theirs} in {MEET} after {timeout} s")
        time.sleep(0.01)


def _pause_leader(fault: str) -> None:
    """Stop src between its first write and the seal, or right after the seal, until the attacker has acted."""
    seg_write, seg_seal = _shm.Segment.write, _shm.Segment.seal
    first = [True]

    def write(self: Any, offset: int, data: torch.Tensor) -> None:
        seg_write(self, offset, data)
        if first[0] and fault in ("attack-before-seal", "kill-while-writing"):
            first[0] = False
            meet("writing", "go")

    def seal(self: Any) -> None:
        seg_seal(self)
        if fault == "attack-after-seal":
            meet("sealed", "go")

    _shm.Segment.write, _shm.Segment.seal = write, seal  # type: ignore[method-assign]


def _truncate(final: str) -> None:
    os.truncate(final, os.path.getsize(final) - 1000)


def _corrupt(final: str) -> None:
    with open(final, "r+b") as fh:
        fh.seek(os.path.getsize(final) - 5000)
        fh.write(b"\xff" * 16)


def _swap(final: str, make: Any) -> None:
    """Put something else in place of the finished file, by rename (atomic, as an attacker would)."""
    other = final + ".attack"
    make(other)
    os.rename(other, final)


def _header_swap(final: str, header: bytes) -> None:
    """Rewrite the file's header in place (same magic, another JSON document)."""
    with open(final, "rb") as fh:
        data = fh.read()
    with open(final, "wb") as fh:
        fh.write(_file.MAGIC + len(header).to_bytes(8, "little") + header + data[16:])


FILE_ATTACKS: dict[str, Any] = {
    "truncate": _truncate,
    "corrupt": _corrupt,
    "fifo": lambda final: _swap(final, os.mkfifo),
    "symlink": lambda final: _swap(final, lambda p: os.symlink("/dev/zero", p)),
    "chown": lambda final: os.chown(final, 65534, 65534),
    "deep-header": lambda final: _header_swap(final, b"[" * 200_000 + b"]" * 200_000),
    "wrong-types": lambda final: _header_swap(
        final, json.dumps({"format": [], "tensors": {"a": 1}, "data_offset": "64", "crc32": 7}).encode()
    ),
}


def main() -> None:
    events = Events()
    logger = logging.getLogger("distinit.broadcast")
    logger.addHandler(events)
    logger.setLevel(logging.DEBUG)
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    rank = dist.get_rank()
    if MEET:
        (Path(MEET) / f"pid-{rank}").write_text(str(os.getpid()))
    inject(os.environ.get("DISTINIT_TEST_FAULT", ""), rank)
    result = scenario(sys.argv[1], rank, events)
    result["segments_after"] = segments()
    # One write(2) for the whole line: under PYTHONUNBUFFERED (CI images set it) print writes the text and the
    # newline separately, and torchrun's ranks share one stdout pipe, so two ranks' lines could merge into one.
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
    if "error" not in result:  # after a lost peer the group is unusable: just exit
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
