from __future__ import annotations

import os
import signal

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
