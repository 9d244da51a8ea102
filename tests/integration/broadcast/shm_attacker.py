"""A same-uid attacker on ``via="shm"`` (issue 23 items 1, 3), run as its own process by the tests.

``python shm_attacker.py MODE MEET``: watches ``/dev/shm`` with inotify for the whole attack, waits for
the leader's marker in MEET, finds the leader's segment the way any process of the same user can (scanning
``/proc/<pid>/fd`` for a ``memfd:distinit-bc-*`` link), reopens it writable (``fchmod`` first: the owner
may), and tries to change, shrink and map it. MODE ``before-seal`` attacks between the leader's first
write and its seal; ``after-seal`` attacks after it, and again once the receivers returned their views.
Writes ``attacker.json`` in MEET: what each attempt gave (``ok`` or the errno name) and what inotify saw.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import mmap
import os
import struct
import sys
import time
from pathlib import Path

IN_CREATE, IN_MOVED_TO, IN_NONBLOCK = 0x100, 0x80, 0o4000


def wait_for(meet: Path, name: str, timeout: float = 90.0) -> str:
    deadline = time.monotonic() + timeout
    while not (meet / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name} in {meet}")
        time.sleep(0.005)
    time.sleep(0.05)  # the marker's text is written right after its creation
    return (meet / name).read_text()


def find_segment(pid: str) -> str:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with_link = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(with_link).startswith("/memfd:distinit-bc-"):
                return with_link
        except OSError:
            continue
    raise FileNotFoundError(f"no distinit memfd among /proc/{pid}/fd")


def attempt(outcomes: dict[str, str], name: str, action: object) -> None:
    try:
        action()  # type: ignore[operator]
        outcomes[name] = "ok"
    except OSError as exc:
        outcomes[name] = errno.errorcode.get(exc.errno or 0, str(exc))


def attack(link: str, outcomes: dict[str, str], suffix: str, keep: list[int]) -> None:
    """Reopen the segment writable and try to change, shrink and map it shared."""
    ro = os.open(link, os.O_RDONLY)
    keep.append(ro)
    attempt(outcomes, "fchmod" + suffix, lambda: os.fchmod(ro, 0o600))
    try:
        rw = os.open(link, os.O_RDWR)
    except OSError as exc:
        outcomes["open writable" + suffix] = errno.errorcode.get(exc.errno or 0, str(exc))
        return
    keep.append(rw)
    attempt(outcomes, "pwrite" + suffix, lambda: os.pwrite(rw, b"\xff" * 4096, 0))
    if suffix:  # before the seal a truncation would only fail the write; after it, it must be refused
        attempt(outcomes, "ftruncate" + suffix, lambda: os.ftruncate(rw, 0))
        attempt(outcomes, "mmap shared" + suffix, lambda: mmap.mmap(rw, 4096, mmap.MAP_SHARED).close())


def main() -> None:
    mode, meet = sys.argv[1], Path(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(IN_NONBLOCK)
    libc.inotify_add_watch(watch, b"/dev/shm", IN_CREATE | IN_MOVED_TO)
    (meet / "attacker-ready").write_text(str(os.getpid()))
    outcomes: dict[str, str] = {}
    keep: list[int] = []
    pid = wait_for(meet, "writing" if mode == "before-seal" else "sealed")
    link = find_segment(pid)
    attack(link, outcomes, "" if mode == "before-seal" else " after seal", keep)
    (meet / "go").write_text("")
    if mode == "after-seal":  # the receivers returned their views: try again through the descriptors kept
        wait_for(meet, "returned-1")
        wait_for(meet, "returned-2")
        for fd in keep:
            attempt(outcomes, f"ftruncate fd {fd} after return", lambda fd=fd: os.ftruncate(fd, 0))
            attempt(outcomes, f"pwrite fd {fd} after return", lambda fd=fd: os.pwrite(fd, b"\xff", 0))
        (meet / "after-done").write_text("")
    created = []
    buf = bytearray(65536)
    n = 0
    with contextlib.suppress(BlockingIOError):  # nothing was created: the expected case
        n = os.readv(watch, [buf])
    at = 0
    while at < n:
        _, _, _, length = struct.unpack_from("iIII", buf, at)
        created.append(bytes(buf[at + 16 : at + 16 + length]).rstrip(b"\0").decode())
        at += 16 + length
    ours = [name for name in created if name.startswith("distinit-bc-")]  # other jobs use /dev/shm too
    (meet / "attacker.json").write_text(json.dumps({"outcomes": outcomes, "created in /dev/shm": ours}))


if __name__ == "__main__":
    main()
