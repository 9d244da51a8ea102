"""The ranks' output files: stdout, stderr and faulthandler stack dumps, read back by the parent."""

from __future__ import annotations

import os
import time

__all__ = ["STACK_DUMP_WAIT", "read_tail", "wait_for_dumps"]

#: How long to wait for a faulthandler stack dump of a rank being torn down.
STACK_DUMP_WAIT = 1.0


def wait_for_dumps(paths: list[str], timeout: float = STACK_DUMP_WAIT) -> None:
    """Wait until each faulthandler dump file is written (non-empty, unchanged for 50 ms), bounded."""
    deadline = time.monotonic() + timeout
    sizes = dict.fromkeys(paths, -1)
    while time.monotonic() < deadline:
        done = True
        for path in paths:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = 0
            if size == 0 or size != sizes[path]:
                done = False
            sizes[path] = size
        if done:
            return
        time.sleep(0.05)


def read_tail(path: str, limit: int = 64_000) -> str:
    """The last ``limit`` bytes of ``path`` as text (a note says how much came before); "" if unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        text = f"[... {size - limit} earlier bytes not shown ...]\n" + text.split("\n", 1)[-1]
    return text
