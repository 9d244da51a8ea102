"""The tests' fork server (tests/_zygote.py) against a fresh interpreter: the same program, the same observations.

The harnesses trust :func:`tests._zygote.popen` to behave as ``subprocess.Popen`` would for their worker scripts;
each case here runs one program both ways and compares what a harness can see: exit status (codes, uncaught
exceptions, signals, an uncaught KeyboardInterrupt), argv, ``sys.path[0]``, environment, working directory, the
standard streams and their buffering, sessions and process groups, threads joined at exit, atexit handlers, and a
fresh ``random`` seed per child.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests._zygote import _plan, popen, uts_prefix

PROGRAM = r"""
import atexit, json, os, random, signal, socket, sys, threading, time
mode = sys.argv[1]
# A process started under a non-interactive shell's background job (`make test &`, CI runners) inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler; the test sends SIGINT as a terminal would.
signal.signal(signal.SIGINT, signal.default_int_handler)
facts = {"argv": sys.argv[1:], "path0": sys.path[0], "cwd": os.getcwd(), "var": os.environ.get("ZYGOTE_VAR"),
         "sid": os.getsid(0) == os.getpid(), "pgrp": os.getpgrp() == os.getpid(), "rand": random.random(),
         "main": __name__, "torch_loaded": "torch" in sys.modules, "host": socket.gethostname(), "pid": os.getpid()}
print(json.dumps(facts), flush=True)
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "message":
    sys.exit("a message")
if mode == "raise":
    raise ValueError("the error text")
if mode == "wait":
    print("waiting", flush=True)
    time.sleep(60)
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread ended", flush=True))).start()
if mode == "atexit":
    atexit.register(lambda: print("atexit ran", flush=True))
if mode == "unflushed":
    sys.stdout.write("buffered line\n")
    os._exit(0)
if mode == "echo":
    print("read " + sys.stdin.readline().strip(), flush=True)
if mode == "stderr":
    print("to stderr", file=sys.stderr)
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    return path


def both(cmd: list[str], **kwargs: Any) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of ``cmd`` run by subprocess.Popen, then by the fork server."""
    results = []
    for start in (subprocess.Popen, popen):
        proc = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        assert (type(proc) is subprocess.Popen) == (start is subprocess.Popen)
        out, err = proc.communicate(timeout=90)
        results.append((proc.returncode, out, err))
    return results


def facts(out: str) -> dict[str, Any]:
    first = json.loads(out.splitlines()[0])
    first.pop("rand")
    first.pop("pid")
    return first


@pytest.mark.parametrize(
    ("args", "code"),
    [(["plain"], 0), (["exit", "3"], 3), (["exit", "300"], 300 & 0xFF), (["message"], 1), (["raise"], 1)],
)
def test_exit_statuses_argv_and_paths_match_a_fresh_interpreter(
    program: Path, tmp_path: Path, args: list[str], code: int
) -> None:
    env = {**os.environ, "ZYGOTE_VAR": "from the caller"}
    fresh, forked = both([sys.executable, str(program), *args], env=env, cwd=tmp_path)
    assert fresh[0] == forked[0] == code
    assert facts(fresh[1]) == {**facts(forked[1]), "torch_loaded": False}
    assert facts(forked[1])["torch_loaded"]  # the point of the server: torch was imported once, before the fork
    assert facts(forked[1])["var"] == "from the caller"
    assert facts(forked[1])["cwd"] == str(tmp_path)
    if args[0] == "raise":  # the traceback starts at the program, as python prints it
        assert forked[2].splitlines()[1:] == fresh[2].splitlines()[1:]
        assert "_zygote" not in forked[2] and "runpy" not in forked[2]
    if args[0] == "message":
        assert forked[2] == fresh[2] == "a message\n"


@pytest.mark.parametrize("mode", ["thread", "atexit", "stderr"])
def test_the_end_of_the_program_matches(program: Path, mode: str) -> None:
    fresh, forked = both([sys.executable, str(program), mode])
    assert fresh[0] == forked[0] == 0
    assert fresh[1].splitlines()[1:] == forked[1].splitlines()[1:]
    assert fresh[2] == forked[2]


def test_buffering_follows_dash_u(program: Path) -> None:
    """Block-buffered output is lost on os._exit in both; with -u it is written at once in both."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    fresh, forked = both([sys.executable, str(program), "unflushed"], env=env)
    assert "buffered line" not in fresh[1] and "buffered line" not in forked[1]
    fresh, forked = both([sys.executable, "-u", str(program), "unflushed"], env=env)
    assert "buffered line" in fresh[1] and "buffered line" in forked[1]


def test_modules_code_and_stdin(program: Path) -> None:
    code = "import sys; print(sys.argv, sys.path[0] == '')"
    fresh, forked = both([sys.executable, "-c", code, "x"])
    assert fresh == forked and fresh[1] == "['-c', 'x'] True\n"
    fresh, forked = both([sys.executable, "-m", "json.tool", "--help"])
    assert fresh[0] == forked[0] == 0 and fresh[1] == forked[1]
    proc = popen([sys.executable, str(program), "echo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate("hello\n", timeout=60)
    assert out.splitlines()[1] == "read hello" and proc.returncode == 0


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGTERM, "wait"), (signal.SIGKILL, "wait"), (signal.SIGINT, "wait")])
def test_signals_end_the_child_as_they_end_a_fresh_one(program: Path, sig: int, mode: str) -> None:
    codes = []
    for start in (subprocess.Popen, popen):
        proc = start([sys.executable, str(program), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()
        assert proc.stdout.readline() == "waiting\n"
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        proc.send_signal(sig)
        codes.append(proc.wait(timeout=30))
        proc.communicate(timeout=30)
    assert codes == [-sig, -sig]


def test_an_uncaught_keyboard_interrupt_ends_by_sigint(program: Path) -> None:
    fresh, forked = both([sys.executable, str(program), "interrupt"])
    assert fresh[0] == forked[0] == -signal.SIGINT
    assert forked[2].rstrip().endswith("KeyboardInterrupt")


def test_sessions_groups_and_seeds(program: Path) -> None:
    fresh, forked = both([sys.executable, str(program), "plain"], start_new_session=True)
    assert facts(fresh[1])["sid"] and facts(forked[1])["sid"]
    own = popen([sys.executable, str(program), "wait"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert own.stdout is not None
    own.stdout.readline()
    os.killpg(own.pid, signal.SIGTERM)  # the group is the child's own: only it is signalled
    assert own.wait(timeout=30) == -signal.SIGTERM
    own.communicate(timeout=30)
    seeds = set()
    for _ in range(3):
        fresh, forked = both([sys.executable, str(program), "plain"])
        seeds.add(json.loads(forked[1].splitlines()[0])["rand"])
    assert len(seeds) == 3  # each child reseeds, as each fresh interpreter does


def test_what_it_cannot_emulate_runs_fresh(program: Path) -> None:
    assert _plan([sys.executable, "-S", str(program)]) is None
    assert _plan(["unshare", "--uts", sys.executable, str(program)]) is None
    assert _plan([sys.executable, "-X", "dev", str(program)]) is None
    proc = popen([sys.executable, "-S", str(program), "plain"], stdout=subprocess.PIPE, text=True)
    assert type(proc) is subprocess.Popen
    proc.communicate(timeout=60)
    proc = popen([sys.executable, str(program), "plain"], stdout=subprocess.PIPE, text=True, preexec_fn=os.getpid)
    assert type(proc) is subprocess.Popen
    proc.communicate(timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="a UTS namespace of its own needs root")
def test_a_host_name_of_its_own_and_the_pid_is_the_programs(program: Path) -> None:
    name = "hôte-ünï-α"  # not ASCII: hostname(1) refuses it, the kernel takes it
    fresh = subprocess.Popen([*uts_prefix(name), sys.executable, str(program), "plain"], stdout=subprocess.PIPE)
    forked = popen([sys.executable, str(program), "plain"], stdout=subprocess.PIPE, hostname=name)
    for proc in (fresh, forked):
        out, _ = proc.communicate(timeout=90)
        seen = json.loads(out.decode().splitlines()[0])
        assert (proc.returncode, seen["host"], seen["pid"]) == (0, name, proc.pid)
    assert socket.gethostname() != name  # the test's own host name is untouched
