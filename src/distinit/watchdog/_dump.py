"""Stack dumps: the worker's faulthandler writes ``<pid>.<start>.stack``; the server reads what was added.

Both sides open the file without following links and without blocking, and check it is a regular file
before use, so a FIFO or symlink planted under the name can neither hang nor redirect them.
"""

from __future__ import annotations

import faulthandler
import os
import stat
import time
from typing import IO

MAX_STACK_BYTES = 64 * 1024


def install(stack_path: str, dump_signal: int) -> IO[bytes]:
    """Open ``stack_path`` (0600, append) and register faulthandler on ``dump_signal`` to write into it.

    Raises:
        OSError: the file cannot be opened or is not a regular file.
        ValueError, RuntimeError: faulthandler refused the signal.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(stack_path, flags, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{stack_path!r} is not a regular file")
    fh = os.fdopen(fd, "ab", buffering=0)
    try:
        faulthandler.register(dump_signal, file=fh, all_threads=True, chain=False)
    except BaseException:
        fh.close()
        raise
    return fh


def file_size(path: str) -> int:
    """The size of the regular file ``path``; -1 when it is missing or not a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


def _read_regular(path: str, offset: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` of the regular file ``path``; a FIFO or symlink gives nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, size, offset) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def collect(path: str, offset: int, timeout: float) -> str | None:
    """Wait until the dump written after ``offset`` stops growing (3 ms quiet) or ``timeout``; return it."""
    deadline = time.monotonic() + timeout
    last, quiet_since = offset, 0.0
    while time.monotonic() < deadline:
        size = file_size(path)
        now = time.monotonic()
        if size > last:
            last, quiet_since = size, now
        elif size > offset and now - quiet_since >= 0.003:
            break
        time.sleep(0.0005)
    if last <= offset:
        return None
    return _read_regular(path, offset, min(last - offset, MAX_STACK_BYTES)).decode("utf-8", "replace") or None
