"""The FileTimer drop-in's wire format and its refusals: hostile request lines, pids never signalled."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import time
from pathlib import Path

import pytest

from distinit.errors import WatchdogError
from distinit.watchdog._timer_server import FileTimerServer, _Request, make_fifo, parse_request
from distinit.watchdog.elastic import FileTimerClient, FileTimerRequest


def _line(**over: object) -> bytes:
    doc = {"version": 1, "pid": 42, "scope_id": "s", "expiration_time": 5.5, "signal": 9, **over}
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        pytest.param(b"nope", "not JSON", id="garbage"),
        pytest.param(b"[" * 5000, "not JSON", id="deep-nesting"),
        pytest.param(b"\xff\xfe", "not JSON", id="not-utf8"),
        pytest.param(b"[1, 2]", "not a JSON object", id="a-list"),
        pytest.param(_line(version=2), "unsupported version", id="version-2"),
        pytest.param(_line(version=True), "unsupported version", id="version-bool"),
        pytest.param(_line(pid="42"), "is not a pid", id="pid-string"),
        pytest.param(_line(pid=True), "is not a pid", id="pid-bool"),
        pytest.param(_line(pid=10**12), "is not a pid", id="pid-huge"),
        pytest.param(_line(scope_id=None), "scope_id NoneType", id="scope-null"),
        pytest.param(_line(expiration_time="soon"), "not a finite number", id="time-string"),
        pytest.param(
            b'{"version": 1, "pid": 1, "scope_id": "s", "expiration_time": NaN, "signal": 9}', "finite", id="nan"
        ),
        pytest.param(_line(expiration_time=1e400), "not a finite number", id="time-inf"),
        pytest.param(_line(signal=999), "not a signal number", id="signal-999"),
        pytest.param(_line(signal=9.0), "not a signal number", id="signal-float"),
    ],
)
def test_hostile_lines_are_refused_with_a_reason(line: bytes, why: str) -> None:
    refused = parse_request(line)
    assert isinstance(refused, str) and why in refused


def test_scopes_are_kept_as_ascii_and_bounded() -> None:
    parsed = parse_request(_line(scope_id="é\n" + "x" * 5000))
    assert isinstance(parsed, FileTimerRequest)
    assert parsed.scope_id.isascii() and parsed.scope_id.startswith("\\xe9\\n") and len(parsed.scope_id) == 1024


def test_the_drop_in_client_speaks_torchs_wire_format(tmp_path: Path) -> None:
    fifo = str(tmp_path / "fifo")
    rfd, wfd = make_fifo(fifo)
    try:
        client = FileTimerClient(fifo, dump_stacks=False)
        client.acquire("scope \u00e9", 1234.5)
        client.release("scope \u00e9")
        client._send_request(FileTimerRequest(7, "x", 9.0, signal.SIGTERM))
        client.close()
        lines = os.read(rfd, 65536).splitlines()
    finally:
        os.close(rfd)
        os.close(wfd)
    docs = [json.loads(line) for line in lines]
    keys = {"version", "pid", "scope_id", "expiration_time", "signal"}  # what torch's server reads
    assert all(keys <= set(doc) for doc in docs)
    assert [(d["pid"], d["scope_id"], d["expiration_time"], d["signal"]) for d in docs] == [
        (os.getpid(), "scope \u00e9", 1234.5, signal.SIGKILL),
        (os.getpid(), "scope \u00e9", -1, 0),
        (7, "x", 9.0, signal.SIGTERM),
    ]
    assert isinstance(docs[0]["start"], int)  # distinit's extra: which process this pid is
    assert FileTimerRequest(7, "x", 9.0, 15).to_json() == lines[2].decode()


def test_pids_that_are_never_signalled(tmp_path: Path) -> None:
    server = FileTimerServer(str(tmp_path / "fifo"), "unit", max_interval=1)
    try:
        # pid 0 and -1 would be the caller's group and every process; -N a group; 1 init; own and parent.
        for pid in (0, -1, -5, 1, os.getpid(), os.getppid(), 2**22):
            server.register_timers([FileTimerRequest(pid, "s", time.time() + 60, signal.SIGKILL)])
            assert server._procs[pid] is None, pid
    finally:
        server.stop()


def test_the_fifo_path_refuses_symlinks_and_directories(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("keep me")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "dir").mkdir()
    for name in ("link", "dir"):
        with pytest.raises(WatchdogError, match="refusing the timer FIFO path"):
            make_fifo(str(tmp_path / name))
    assert (tmp_path / "target").read_text() == "keep me"
    with pytest.raises(ValueError, match="max_interval"):
        FileTimerServer(str(tmp_path / "f"), "x", max_interval=0)


def test_no_server_raises_broken_pipe_or_fails_open_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(BrokenPipeError, match="FileTimerServer is not available"):
        FileTimerClient(missing, dump_stacks=False).acquire("s", time.time() + 1)
    quiet = FileTimerClient(missing, fail_open=True, dump_stacks=False)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="distinit.watchdog"):
        for _ in range(100):
            quiet.acquire("s", time.time() + 1)
            quiet.release("s")
    assert time.monotonic() - started < 5  # one open attempt, then none for 5 s: never 1 s per region
    assert len([r for r in caplog.records if "fail_open" in r.getMessage()]) == 1
    with pytest.raises(TypeError, match="signal must be an int"):
        FileTimerClient(missing, signal="SIGKILL")  # type: ignore[arg-type]


def test_a_request_line_must_fit_one_atomic_fifo_write(tmp_path: Path) -> None:
    # The line with its newline is one write of at most PIPE_BUF bytes: a longer one can be cut short or
    # interleaved with other workers' lines (torch's client allows one byte more).
    fifo = str(tmp_path / "fifo")
    rfd, wfd = make_fifo(fifo)
    try:
        client = FileTimerClient(fifo)
        client.acquire("s", 1.0)
        overhead = len(os.read(rfd, 65536)) - 1
        client.acquire("s" * (select.PIPE_BUF - overhead), 1.0)
        assert len(os.read(rfd, 65536)) == select.PIPE_BUF
        with pytest.raises(RuntimeError, match="larger than"):
            client.acquire("s" * (select.PIPE_BUF - overhead + 1), 1.0)
        client.close()
    finally:
        os.close(rfd)
        os.close(wfd)


def test_run_once_drops_timers_of_processes_that_are_gone(tmp_path: Path) -> None:
    # torch's test_expired_timers, as a race: the server thread woke on the first of two lines (an expired
    # timer of pid -3), reaped, then read a valid timer of the same pid just after its sweep; run_once()
    # kept it, since sweeps of exited workers are rate-limited. run_once()'s last pass always sweeps.
    server = FileTimerServer(str(tmp_path / "fifo"), "test", max_interval=5)
    try:
        server.register_timers([FileTimerRequest(-3, "test1", time.time() - 60, signal.SIGKILL)])
        server._reap_expired()
        server.register_timers([FileTimerRequest(-3, "test2", time.time() + 60, signal.SIGKILL)])
        server.run_once()
        assert server._timers == {}
    finally:
        server.stop()


def test_an_escaped_scope_never_equals_a_literal_one() -> None:
    # "é" is kept as the escape \xe9; the literal 4-character scope "\xe9" must stay another scope.
    literal, accented = parse_request(_line(scope_id="\\xe9")), parse_request(_line(scope_id="\u00e9"))
    assert isinstance(literal, FileTimerRequest) and isinstance(accented, FileTimerRequest)
    assert literal.scope_id != accented.scope_id
    assert parse_request(_line(scope_id="step-3")).scope_id == "step-3"  # plain scopes are kept as they are


@pytest.mark.parametrize(
    ("extra", "thread", "ranks"),
    [
        pytest.param({}, None, (None, None, None), id="torch-client"),
        pytest.param({"thread": 140001, "rank": 3, "local_rank": 1, "world_size": 4}, 140001, (3, 1, 4), id="all"),
        pytest.param({"thread": -1, "rank": "3", "world_size": True}, None, (None, None, None), id="malformed"),
        pytest.param({"thread": 2**64, "rank": 2**40}, None, (None, None, None), id="out-of-range"),
    ],
)
def test_what_a_client_may_add_is_kept_and_malformed_additions_are_unknown(
    extra: dict[str, object], thread: int | None, ranks: tuple[int | None, ...]
) -> None:
    parsed = parse_request(_line(**extra))
    assert isinstance(parsed, _Request)
    assert parsed.thread == thread
    assert (parsed.claimed.rank, parsed.claimed.local_rank, parsed.claimed.world_size) == ranks
