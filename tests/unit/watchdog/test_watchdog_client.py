"""The client without a server: fail-open, slots, nesting, threads, scopes, heartbeat (no processes)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from distinit.errors import WatchdogError
from distinit.watchdog import WatchdogClient, _slots, configure, expires


@pytest.fixture
def client(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[WatchdogClient]:
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=False)
    yield c
    c.close()


def reader_for(c: WatchdogClient) -> _slots.TableReader:
    start = _slots.parse_file_name(next(p.name for p in Path(c.path).glob("*.slots")))
    assert start is not None
    return _slots.TableReader(os.path.join(c.path, _slots.slot_file_name(*start)), os.geteuid())


def test_no_server_fails_open_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=False)
        for _ in range(1000):
            with c.expires(10):
                pass
    assert not c.registered
    assert "cannot reach the watchdog server" in c.reason
    assert [r.distinit["event"] for r in caplog.records] == ["watchdog.fail_open"]  # type: ignore[attr-defined]
    assert oct((tmp_path / "wd").stat().st_mode & 0o777) == "0o700"
    c.close()


def test_fail_closed_raises_with_what_why_fix(tmp_path: Path) -> None:
    with pytest.raises(WatchdogError) as caught:
        WatchdogClient(str(tmp_path / "wd"), fail_closed=True, dump_stacks=False)
    err = caught.value
    assert f"pid {os.getpid()}" in err.what
    assert err.why
    assert "distinit watchdog serve" in err.fix
    assert not list((tmp_path / "wd").glob("*.slots"))  # nothing left behind


def test_client_refuses_a_directory_others_can_enter(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    c = WatchdogClient(str(loose), dump_stacks=False)
    assert "mode 777" in c.reason
    assert not list(loose.iterdir())  # no table planted in a shared directory
    with c.expires(1):  # still never throws
        pass
    c.close()


def test_nested_regions_each_own_a_slot(client: WatchdogClient) -> None:
    reader = reader_for(client)
    with client.expires(100, scope="outer"):
        with client.expires(200, scope="outer"):
            assert len(reader.armed()) == 2
        ((slot, _),) = reader.armed()  # the inner exit disarmed only the inner region
        assert reader.slot_info(slot)[2] == "outer"
    assert reader.armed() == []
    reader.close()


def test_deadline_is_monotonic_now_plus_after(client: WatchdogClient) -> None:
    reader = reader_for(client)
    before = time.monotonic()
    with client.expires(timedelta(seconds=30), scope="s"):
        ((slot, deadline),) = reader.armed()
        _, armed_at, scope, thread = reader.slot_info(slot)
    assert before <= armed_at <= time.monotonic()
    assert deadline == pytest.approx(armed_at + 30)
    assert (scope, thread) == ("s", threading.get_ident())
    assert reader.arms == 1
    reader.close()


def test_default_scope_is_the_callers_file_and_line(client: WatchdogClient) -> None:
    reader = reader_for(client)
    with client.expires(10):
        line = _current_line() - 1
        ((slot, _),) = reader.armed()
    assert reader.slot_info(slot)[2] == f"{__file__}:{line}"
    reader.close()


def _current_line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def test_threads_never_share_slots(client: WatchdogClient) -> None:
    reader = reader_for(client)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def hammer() -> None:
        try:
            barrier.wait(5)
            for _ in range(5000):
                with client.expires(60, scope="t"):
                    pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    with client.expires(60, scope="held"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [reader.slot_info(s)[2] for s, _ in reader.armed()] == ["held"]
    assert errors == []
    assert reader.armed() == []
    reader.close()


def test_overflow_runs_unguarded_with_one_warning(client: WatchdogClient, caplog: pytest.LogCaptureFixture) -> None:
    handles = [client.arm(60, scope="many") for _ in range(_slots.NSLOTS - 1)]
    assert -1 not in handles
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        assert client.arm(60, scope="many") == -1
        assert client.arm(60, scope="many") == -1
    assert client.overflows == 2
    assert len(caplog.records) == 1
    client.disarm(-1)  # a no-op, never an error
    for h in handles:
        client.disarm(h)
    assert client.arm(60, scope="again") != -1


def test_scope_table_full_falls_back_to_a_shared_name(client: WatchdogClient) -> None:
    for i in range(_slots.NSCOPES + 5):
        client.disarm(client.arm(1, scope=f"scope-{i}"))
    reader = reader_for(client)
    h = client.arm(1, scope="one-too-many")
    assert reader.slot_info(h)[2] == _slots.OVERFLOW_SCOPE
    reader.close()


def test_heartbeat_moves_the_deadline(client: WatchdogClient) -> None:
    reader = reader_for(client)
    client.beat()  # outside liveness mode: a no-op
    assert reader.armed() == []
    with client.heartbeat(timeout=50) as hb:
        ((slot, first),) = reader.armed()
        assert reader.slot_info(slot)[2] == "heartbeat"
        time.sleep(0.01)
        hb.beat()
        assert reader.deadline(slot) > first
    assert reader.armed() == []
    reader.close()


def test_close_removes_the_table_and_is_idempotent(tmp_path: Path) -> None:
    c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=False)
    assert list((tmp_path / "wd").glob("*.slots"))
    c.close()
    c.close()
    assert not list((tmp_path / "wd").glob("*.slots"))


@pytest.mark.parametrize(
    ("after", "error", "match"),
    [
        pytest.param(0, ValueError, "> 0", id="zero"),
        pytest.param(-1.0, ValueError, "> 0", id="negative"),
        pytest.param(float("nan"), ValueError, "NaN", id="nan"),
        pytest.param(float("inf"), ValueError, "finite", id="inf"),
        pytest.param("60", TypeError, "str", id="string"),
        pytest.param(True, TypeError, "bool", id="bool"),
        pytest.param(None, TypeError, "NoneType", id="none"),
    ],
)
def test_bad_durations_are_rejected_up_front(
    client: WatchdogClient, after: object, error: type[Exception], match: str
) -> None:
    for call in (client.expires, client.arm, client.heartbeat, expires):
        with pytest.raises(error, match=match):
            call(after)  # type: ignore[arg-type]


def test_module_expires_fails_open_without_a_client(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("DISTINIT_WATCHDOG", raising=False)
    configure(None)  # also re-arms the one-time warning, whatever earlier tests did
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        for _ in range(3):
            with expires(after=5):
                pass
    (record,) = caplog.records  # one warning, not one per call
    assert record.distinit == {"event": "watchdog.fail_open", "reason": "no client"}  # type: ignore[attr-defined]
    assert "running unguarded" in record.getMessage()
    caplog.clear()
    configure(None)
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"), expires(after=5):
        pass
    assert len(caplog.records) == 1  # configure(None) reset the warned flag


def test_module_expires_uses_the_configured_client(client: WatchdogClient) -> None:
    reader = reader_for(client)
    configure(client)
    try:
        with expires(after=5):
            line = _current_line() - 1
            ((slot, _),) = reader.armed()
            assert reader.slot_info(slot)[2] == f"{__file__}:{line}"
        with expires(5, "named"):
            ((slot, _),) = reader.armed()
            assert reader.slot_info(slot)[2] == "named"
    finally:
        configure(None)
        reader.close()


def test_module_expires_creates_a_client_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from distinit.watchdog._global import configured_client

    monkeypatch.setenv("DISTINIT_WATCHDOG", str(tmp_path / "wd"))
    configure(None)
    try:
        with caplog.at_level(logging.WARNING, logger="distinit.watchdog"), expires(after=5, scope="env"):
            made = configured_client()
            assert made is not None
            assert made.path == str(tmp_path / "wd")
            reader = reader_for(made)
            ((slot, _),) = reader.armed()
            assert reader.slot_info(slot)[2] == "env"
            reader.close()
    finally:
        made = configured_client()
        configure(None)
        if made is not None:
            made.close()


def test_double_disarm_never_hands_a_slot_out_twice(client: WatchdogClient) -> None:
    h = client.arm(60, scope="once")
    client.disarm(h)
    client.disarm(h)  # misuse: must not put the slot on the free list twice
    a, b = client.arm(60, scope="a"), client.arm(60, scope="b")
    assert a != b
    client.disarm(a)
    client.disarm(b)


def test_close_removes_the_files_of_a_client_that_failed_open(tmp_path: Path) -> None:
    c = WatchdogClient(str(tmp_path / "wd"), dump_stacks=True)
    assert {p.suffix for p in (tmp_path / "wd").iterdir()} == {".slots"}  # no stack file without a server
    c.close()
    assert list((tmp_path / "wd").iterdir()) == []  # the promise: this process's files are removed


@pytest.mark.parametrize("handle", [-1, 0, _slots.NSLOTS, _slots.NSLOTS + 5, 2**40, -(2**40)])
def test_disarm_of_any_handle_never_raises(client: WatchdogClient, handle: int) -> None:
    armed = client.arm(60, scope="kept")
    client.disarm(handle)  # documented never to raise: out of range is a no-op
    reader = reader_for(client)
    assert [s for s, _ in reader.armed()] == [armed]  # and it disarmed nothing else
    reader.close()
    client.disarm(armed)


def test_a_second_client_on_one_path_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from distinit.watchdog._global import configured_client

    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        first = WatchdogClient(str(tmp_path / "wd"), dump_stacks=False)
        with pytest.raises(WatchdogError, match="already has an open WatchdogClient") as caught:
            WatchdogClient(str(tmp_path / "wd" / "."), dump_stacks=False)  # the same directory, spelled otherwise
        assert "close()" in caught.value.fix
        first.close()
        again = WatchdogClient(str(tmp_path / "wd"), dump_stacks=False)  # after close(): a fresh table
    reader = reader_for(again)
    with again.expires(30, scope="fresh"):
        assert [reader.slot_info(s)[2] for s, _ in reader.armed()] == ["fresh"]
    reader.close()
    monkeypatch.setenv("DISTINIT_WATCHDOG", str(tmp_path / "wd"))
    configure(None)
    try:
        assert configured_client() is again  # expires() shares the process's client instead of raising
    finally:
        configure(None)
        again.close()
