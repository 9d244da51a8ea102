"""The doctor's ``shm`` check and distinit's own broadcast entries: removed only when their creator is provably gone.

Each test starts a real child process (``cat``) and lets it exit: a creator that is provably gone.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from distinit.broadcast._transport import creator as _creator
from distinit.doctor._shm import check_shm, stale_files


def _dead_tag() -> str:
    """The creator tag of a process that ran and exited (its pid may be reused: its start time then differs).

    Read from ``/proc`` while the process lives, as ``creator.tag()`` in it would: a ``cat`` waiting on its
    stdin, not a Python that imports distinit (and torch with it: 15-34 s under load, issue 34)."""
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        tag = _creator.tag(proc.pid)
    finally:
        proc.communicate(timeout=60)  # closes its stdin: it exits, and is reaped
    found = _creator.creator(f"{_creator.PREFIX}{tag}-1")
    assert proc.returncode == 0 and found is not None and found[1] > 0 and _creator.gone(*found), tag
    return tag


def test_a_dead_creators_segments_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    dead, alive = _dead_tag(), _creator.tag()
    assert _creator.creator(f"distinit-bc-{alive}-3") == (os.getpid(), _creator.start_time(os.getpid()))
    orphans = [f"distinit-bc-{dead}-7", f".distinit-bc-0123abcd-2.bin-{dead}.tmp"]
    for name in [*orphans, f"distinit-bc-{alive}-7", "distinit-bc-untagged-1-h0"]:
        (tmp_path / name).write_bytes(b"x" * 4096)
    os.symlink("/etc/hostname", tmp_path / f"distinit-bc-{dead}-8")  # a link is never removed (nor followed)
    check = check_shm(local_world_size=1, shm=str(tmp_path))
    assert sorted(check.evidence["removed"]) == sorted(orphans), check
    assert "removed 2 distinit broadcast segment(s)" in check.summary
    left = sorted(os.listdir(tmp_path))
    assert left == sorted([f"distinit-bc-{alive}-7", f"distinit-bc-{dead}-8", "distinit-bc-untagged-1-h0"])
    # the untagged one (an older distinit's) and the link are reported, not removed; the live one is neither
    assert stale_files(str(tmp_path)) == [f"distinit-bc-{dead}-8", "distinit-bc-untagged-1-h0"]
    assert check.status == "warn" and os.path.exists("/etc/hostname")


def test_a_segment_held_open_is_never_stale(tmp_path: Path) -> None:
    name = f"distinit-bc-{_dead_tag()}-1"
    with open(tmp_path / name, "wb") as held:
        held.write(b"x")
        held.flush()
        assert stale_files(str(tmp_path)) == []
        assert check_shm(local_world_size=1, shm=str(tmp_path)).evidence["removed"] == []
    assert (tmp_path / name).exists()
