"""The ``shm`` check: /dev/shm size and free space, segments left behind by processes that are gone, broadcast pools.

distinit's own broadcast entries (``distinit-bc-*``, and the file transport's ``.distinit-bc-*.tmp``) carry
their creator's pid and start time (``-p<pid>s<start>``, see ``distinit.broadcast._transport.creator``; the doctor reads
the names and does not import broadcast): one whose creator is provably gone,
that no process holds open or mapped, owned by this user, is removed by the check (and reported); every
other stale entry is only reported, with the command that removes it.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from distinit.doctor._model import Check

SHM = "/dev/shm"
#: NCCL's smallest shared-memory segment (``posix_fallocate`` of 9,637,888 bytes, NCCL#290): per local rank.
NCCL_SEGMENT_BYTES = 9_637_888
#: ``ds_report``'s threshold: below it, large NCCL/DataLoader jobs run out.
WARN_BYTES = 512 * 1024 * 1024
_BROADCAST = "distinit-bc-"
_PREFIXES = ("nccl-", "torch_", "distinit-watchdog-", _BROADCAST, "." + _BROADCAST)
#: The creator tag of a distinit broadcast name: ``-p<pid>s<start time in clock ticks since boot>``.
_CREATOR = re.compile(r"-p(\d+)s(\d+)(?:[-.]|$)")
_TORCH_PID = re.compile(r"^torch_(\d+)_")
_POOL = "/memfd:" + _BROADCAST + "pool-"
_MiB = 1024 * 1024


def _in_use(shm: str) -> set[str]:
    """Paths under ``shm`` mapped or open by any process we can see (read only when there are candidates)."""
    used: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as fh:
                used.update(line.split(None, 5)[5].strip() for line in fh if shm in line and line.count(" ") >= 5)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(shm):
                    used.add(target)
        except OSError:  # the process exited, or is not ours to read
            continue
    return {path.removesuffix(" (deleted)") for path in used}


def stale_files(shm: str = SHM) -> list[str]:
    """nccl-*, torch_* and distinit watchdog entries under ``shm`` whose owning process is gone."""
    try:
        candidates = sorted(n for n in os.listdir(shm) if n.startswith(_PREFIXES))
    except OSError:
        return []
    if not candidates:
        return []
    used = _in_use(shm)
    stale = []
    for name in candidates:
        path = os.path.join(shm, name)
        if name.startswith("distinit-watchdog-"):
            continue  # a directory a live daemon may re-adopt; only its sockets' owners could tell
        match = _TORCH_PID.match(name)
        if match and os.path.exists(f"/proc/{match.group(1)}"):  # its creator still runs
            continue
        made_by = _creator(name)
        if made_by and _alive(*made_by):  # a distinit broadcast still running
            continue
        if path not in used:
            stale.append(name)
    return stale


def pooled_segments() -> dict[int, int]:
    """Bytes of distinit's broadcast pool segments (issue 27) held by this user's processes, by creator pid.

    A pooled segment is a nameless memory file, never in /dev/shm: it shows only as a
    ``/memfd:distinit-bc-pool-p<pid>s<start>`` descriptor of the process that writes it and of each reader
    that keeps it mapped; each segment (device, inode) is counted once, under the pid in its name. Nothing
    to remove: it goes with its last holder.
    """
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                made_by = _CREATOR.search(target.removesuffix(" (deleted)")) if target.startswith(_POOL) else None
                if made_by:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    seen[(st.st_dev, st.st_ino)] = (int(made_by.group(1)), st.st_size)
        except OSError:  # the process or descriptor went away, or is not ours to read
            continue
    held: dict[int, int] = {}
    for creator, size in seen.values():
        held[creator] = held.get(creator, 0) + size
    return held


def _creator(name: str) -> tuple[int, int] | None:
    """The (pid, start time) a distinit broadcast name carries; None for any other name, or an untagged one."""
    match = _CREATOR.search(name) if _BROADCAST in name else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def _alive(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (``/proc/<pid>/stat`` field 22)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    except OSError:
        return False
    return len(fields) > 19 and fields[19] == str(start).encode()


def remove_orphans(shm: str, stale: list[str]) -> list[str]:
    """Remove the ``distinit-bc-*`` entries of ``stale`` whose creator (pid + start time in the name) is gone.

    Only regular files owned by this user are removed, never followed through a link; an entry without a
    creator tag (an older distinit's) is left for the user. Returns the names removed.
    """
    removed = []
    for name in stale:
        if _creator(name) is None:
            continue
        path = os.path.join(shm, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.unlink(path)
                removed.append(name)
        except OSError:  # gone already, or not ours to remove
            continue
    return removed


def check_shm(*, local_world_size: int, shm: str = SHM) -> Check:
    """Size and free space of ``shm`` for ``local_world_size`` ranks, and stale segments."""
    try:
        st = os.statvfs(shm)
    except OSError as exc:
        return Check(
            id="shm",
            status="fail",
            summary=f"{shm} is unusable: {exc.strerror}",
            fix="mount a tmpfs there (docker: --shm-size=1g / --ipc=host), or export NCCL_SHM_DISABLE=1",
        )
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    need = NCCL_SEGMENT_BYTES * local_world_size
    stale = stale_files(shm)
    removed = remove_orphans(shm, stale)
    stale = [name for name in stale if name not in removed]
    pooled = pooled_segments()
    evidence = {"path": shm, "size_bytes": size, "free_bytes": free, "need_bytes": need, "stale": stale[:50],
                "removed": removed[:50], "pooled": {str(pid): n for pid, n in pooled.items()}}  # fmt: skip
    text = f"{shm}: {size / _MiB:.0f} MiB, {free / _MiB:.0f} MiB free for {local_world_size} local ranks"
    if pooled:  # memory outside /dev/shm, held on purpose (DISTINIT_SHM_POOL_BYTES caps it per process)
        pids = ", ".join(map(str, list(pooled)[:3])) + (", ..." if len(pooled) > 3 else "")  # lines stay short
        text += f"; broadcast pools hold {sum(pooled.values()) / _MiB:.0f} MiB (pids {pids})"
    if removed:
        text += f"; removed {len(removed)} distinit broadcast segment(s) of processes that are gone"
    if free < need:
        return Check(
            id="shm",
            status="fail",
            summary=f"{text}; NCCL needs {need / _MiB:.1f} MiB ({NCCL_SEGMENT_BYTES} bytes per local rank)",
            fix="enlarge it (docker: --shm-size=1g or --ipc=host; `mount -o remount,size=1G /dev/shm`), "
            "remove stale segments, or export NCCL_SHM_DISABLE=1",
            evidence=evidence,
        )
    if stale:
        return Check(
            id="shm",
            status="warn",
            summary=f"{text}; {len(stale)} stale segment(s) of processes that are gone: {', '.join(stale[:5])}",
            fix=f"remove them: rm {' '.join(os.path.join(shm, n) for n in stale[:5])}",
            evidence=evidence,
        )
    if size < WARN_BYTES:
        return Check(
            id="shm",
            status="warn",
            summary=f"{text}; below {WARN_BYTES // _MiB} MiB",
            fix="enlarge it (docker: --shm-size=1g or --ipc=host) before large NCCL or DataLoader jobs",
            evidence=evidence,
        )
    return Check(id="shm", status="pass", summary=text, evidence=evidence)
