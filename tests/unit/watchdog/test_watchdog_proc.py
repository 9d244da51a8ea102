from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from distinit.watchdog import _proc
from distinit.watchdog._ladder import signal_name


def test_own_start_time_and_state() -> None:
    start = _proc.start_time(os.getpid())
    assert isinstance(start, int)
    assert start > 0
    assert _proc.state(os.getpid()) == "R"
    assert _proc.owner_uid(os.getpid()) == os.geteuid()


def test_a_pid_that_does_not_exist() -> None:
    missing = 2**22 + 12345  # above the default pid_max
    assert _proc.start_time(missing) is None
    assert _proc.state(missing) is None
    assert _proc.owner_uid(missing) is None


def test_never_self_parent_or_init() -> None:
    for pid in (0, 1, os.getpid(), os.getppid()):
        assert _proc.is_protected(pid)
        assert _proc.ProcessRef.open(pid) is None
    fake_self = _proc.ProcessRef(pid=os.getpid(), start=_proc.start_time(os.getpid()) or 0)
    assert fake_self.send(signal.SIGKILL) is False  # refused before any syscall: we are still here


def test_signal_names() -> None:
    assert signal_name(signal.SIGTERM) == "SIGTERM"
    assert signal_name(signal.SIGRTMIN + 6) == "SIGRTMIN+6"
    assert signal_name(200) == "signal 200"


def test_a_thread_id_is_never_a_process() -> None:
    """``kill(tid)`` signals the whole process: a thread id that is not its group's leader is refused."""
    ready, stop, tids = threading.Event(), threading.Event(), []

    def hold() -> None:
        tids.append(threading.get_native_id())
        ready.set()
        stop.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert ready.wait(5)
        (tid,) = tids
        assert tid != os.getpid()
        assert _proc.tgid(tid) == os.getpid()
        assert _proc.tgid(os.getpid()) == os.getpid()
        for use_pidfd in (True, False):
            assert _proc.ProcessRef.open(tid, use_pidfd=use_pidfd) is None
    finally:
        stop.set()
        t.join(5)


def test_maps_file_sees_only_what_the_process_mapped(tmp_path: Path) -> None:
    from distinit.watchdog import _slots

    mapped, planted = tmp_path / "1.2.slots", tmp_path / "3.4.slots"
    mm = _slots.create_table(str(mapped), 1, 2)
    _slots.create_table(str(planted), 3, 4).close()
    try:
        for path, expected in ((mapped, True), (planted, False)):
            st = path.stat()
            assert _proc.maps_file(os.getpid(), st.st_dev, st.st_ino) is expected
    finally:
        mm.close()
    assert _proc.maps_file(2**22 + 12345, 1, 1) is False
