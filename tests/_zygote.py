"""A fork server for the tests' own worker scripts: torch is imported once, then each ``python script.py`` is a fork.

Why: importing torch costs about 3 CPU-seconds per interpreter on CI's machine (``python -X importtime -c
"import torch"``: 2.7 s, most of it torch's own Python registrations), and the integration harnesses start well over
a thousand rank interpreters. The clean-clone suite was CPU-bound at 99-100% busy for 40 minutes (issue 34,
benchmarks/results/suite.json); most of that CPU was the same import, again and again.

:func:`popen` is a drop-in for ``subprocess.Popen`` for a command ``[sys.executable, *options, script|-m mod|-c code,
*args]``. It asks a server (one per pytest process and import-time environment, started on first use) that imported
torch and ``torch.distributed`` once to fork a child; the child then sets itself up as ``python`` would (argv,
``sys.path[0]``, environment, working directory, standard streams and their buffering, session or process group,
``-u``/``-X faulthandler``/``-W``, a fresh ``random`` seed), runs the program as ``__main__`` and ends as the
interpreter does (non-daemon threads joined, atexit handlers run, streams flushed; an uncaught KeyboardInterrupt ends
it by SIGINT). It returns a real :class:`subprocess.Popen` whose ``pid`` is the child's, so ``poll``, ``wait``,
``communicate``, the pipes, ``send_signal``, ``kill`` and ``killpg`` work as usual; the child's exit status, which
only its parent (the server) can collect, comes back over a socket of its own.

What differs from a fresh interpreter, and why the harnesses that use it do not mind:

- torch and torch.distributed are already imported (each worker imports them first anyway), and what torch read from
  the environment at import came from the server's environment: a server serves only requests whose import-time
  variables (:data:`IMPORT_TIME`, ``TORCH_*``, ``PYTORCH_*``, ``OMP_*``, ...) match its own.
- the parent process is the server, not the test; the hash seed and ``sys.flags`` are the server's.
- the process ends with ``os._exit`` after the steps above, without the module teardown of ``Py_Finalize``.
- ``/proc/<pid>/environ`` shows the environment the server started with, not the child's (only an exec, or
  ``prctl(PR_SET_MM)`` with CAP_SYS_RESOURCE, which CI's container lacks, can change it). distinit's watchdog reads
  a worker's rank from there, so the watchdog tests keep ``subprocess.Popen``.

Anything else (other interpreter options, ``preexec_fn``, ``pass_fds``, a ``prefix`` such as ``ip netns exec``,
``unshare``, a launcher) runs through plain ``subprocess.Popen``: harnesses that need a fresh interpreter (import
behaviour, launchers, namespaces) get one. ``DISTINIT_TEST_ZYGOTE=0`` turns the server off everywhere.

The server is started by pid and stopped by pid (at the pytest process's exit; it also ends by itself when its
control socket closes and its last child was reaped). No file is created: the sockets are socket pairs.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

#: Variables an interpreter (or torch at import) reads at start-up: a server only serves their own values.
IMPORT_TIME = (
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "PYTHONUTF8",
    "PYTHONIOENCODING",
    "PYTHONDEVMODE",
    "PYTHONMALLOC",
    "PYTHONOPTIMIZE",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
)
IMPORT_TIME_PREFIXES = ("TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "CUDA_")
#: The Popen keywords the fork emulates; any other one (preexec_fn, pass_fds, user, ...) goes to subprocess.Popen.
SUPPORTED = frozenset(
    {
        "stdin",
        "stdout",
        "stderr",
        "env",
        "cwd",
        "text",
        "universal_newlines",
        "encoding",
        "errors",
        "bufsize",
        "start_new_session",
        "process_group",
        "close_fds",
    }
)
#: At most this many servers per pytest process (one per distinct import-time environment); the oldest is retired.
MAX_SERVERS = 3
#: How long a server may take to import torch on a loaded machine.
START_BOUND = 120.0


def popen(cmd: Sequence[str], *, hostname: str | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **kwargs)``, forked from a server that imported torch when the command allows it.

    ``hostname``: run the program in a UTS namespace of its own under that host name (root only), as
    ``[*uts_prefix(hostname), *cmd]`` would; the pid is the program's either way.
    """
    plan = _plan(cmd)
    if plan is None or not set(kwargs) <= SUPPORTED or os.environ.get("DISTINIT_TEST_ZYGOTE") == "0":
        return subprocess.Popen([*uts_prefix(hostname), *cmd] if hostname is not None else cmd, **kwargs)
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    plan["hostname"] = hostname
    return _ZygotePopen(_server_for(env), plan, list(cmd), **kwargs)


#: Names the host in a new UTS namespace (any bytes the kernel takes: hostname(1) refuses non-ASCII), then execs
#: the command: unshare without --fork, so the pid the test holds is the program's.
_NAMING = "import os, socket, sys; socket.sethostname(sys.argv[1].encode()); os.execv(sys.argv[2], sys.argv[2:])"


def uts_prefix(hostname: str) -> list[str]:
    """A command prefix that runs what follows in a UTS namespace of its own, named ``hostname`` (root only)."""
    return ["unshare", "--uts", sys.executable, "-S", "-c", _NAMING, hostname]


def _plan(cmd: Sequence[str]) -> dict[str, Any] | None:
    """What the interpreter options of ``cmd`` ask for, or None when the fork cannot emulate them."""
    if not cmd or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    plan: dict[str, Any] = {"unbuffered": False, "faulthandler": False, "warnings": []}
    args = list(cmd[1:])
    while args:
        arg = args.pop(0)
        if arg == "-u":
            plan["unbuffered"] = True
        elif arg in ("-X", "-W") and args:
            value = args.pop(0)
            if arg == "-W":
                plan["warnings"].append(value)
            elif value == "faulthandler":
                plan["faulthandler"] = True
            else:
                return None
        elif arg in ("-m", "-c") and args:
            plan["kind"], plan["target"], plan["argv"] = arg, args[0], args[1:]
            return plan
        elif arg.startswith("-"):
            return None
        else:
            plan["kind"], plan["target"], plan["argv"] = "file", arg, args
            return plan
    return None


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k in IMPORT_TIME or k.startswith(IMPORT_TIME_PREFIXES)))


#: CPU seconds of the forked children this process has collected (the server reaps them, so they are missing
#: from this process's ``RUSAGE_CHILDREN``); tests/conftest.py adds them to a test's CPU when asked to measure.
_forked_cpu = [0.0]
_forked_cpu_lock = threading.Lock()


def forked_cpu() -> float:
    """CPU seconds (user + system) of the forked children collected so far, with their own reaped children."""
    with _forked_cpu_lock:
        return _forked_cpu[0]


def _count_cpu(seconds: float) -> None:
    with _forked_cpu_lock:
        _forked_cpu[0] += seconds


_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
_servers_lock = threading.Lock()


def _server_for(env: dict[str, str]) -> _Server:
    key = _key(env)
    with _servers_lock:
        server = _servers.get(key)
        if server is None or server.proc.poll() is not None or server.pid_owner != os.getpid():
            while len(_servers) >= MAX_SERVERS:
                _servers.pop(next(iter(_servers))).retire()
            server = _servers[key] = _Server(dict(key))
        return server


class _Server:
    """The client's handle on one fork server: its process (by pid) and its control socket."""

    def __init__(self, import_env: dict[str, str]) -> None:
        env = {k: v for k, v in os.environ.items() if not (k in IMPORT_TIME or k.startswith(IMPORT_TIME_PREFIXES))}
        env.update(import_env)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid_owner = os.getpid()
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        theirs.close()
        self.control = mine
        ready, _, _ = select.select([mine, self.proc.stderr], [], [], START_BOUND)
        if mine not in ready or mine.recv(16) != b"ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise RuntimeError(f"the test fork server did not start: {err.decode(errors='replace')[-2000:]}")
        atexit.register(self.stop)

    def spawn(self, request: dict[str, Any], fds: list[int]) -> tuple[int, socket.socket]:
        """Ask for a child; its pid, and the socket its exit status will arrive on."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with self.lock:
            socket.send_fds(self.control, [json.dumps(request).encode()], [theirs.fileno(), *fds])
        theirs.close()
        ready, _, _ = select.select([mine], [], [], 60)
        reply = mine.recv(64) if ready else b""
        if not reply.startswith(b"pid "):
            mine.close()
            raise RuntimeError(f"the test fork server (pid {self.proc.pid}) did not fork: {reply!r}")
        return int(reply.split()[1]), mine

    def retire(self) -> None:
        """Close the control socket: the server ends once its running children have ended."""
        self.control.close()

    def stop(self) -> None:
        """Stop the server, by pid (the children it forked are the harnesses' to stop)."""
        self.control.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class _ZygotePopen(subprocess.Popen):  # type: ignore[type-arg]
    """A ``subprocess.Popen`` whose child is forked by a :class:`_Server` instead of exec'd by this process."""

    def __init__(self, server: _Server, plan: dict[str, Any], args: list[str], **kwargs: Any) -> None:
        self._zygote = server
        self._zygote_plan = plan
        self._zygote_status: socket.socket | None = None
        super().__init__(args, **kwargs)

    def _execute_child(  # type: ignore[override]
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        *rest: Any,
    ) -> None:
        # rest: restore_signals, gid, gids, uid, umask, start_new_session[, process_group (3.11+)]
        environ = dict(os.environ) if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        request = {
            **self._zygote_plan,
            "cwd": None if cwd is None else os.fsdecode(cwd),
            "env": environ,
            "session": bool(rest[5]),
            "pgroup": rest[6] if len(rest) > 6 and rest[6] is not None else -1,
        }
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        try:
            self.pid, self._zygote_status = self._zygote.spawn(request, fds)
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        """(pid, raw wait status) as ``os.waitpid`` would give it: the server sends it when it reaps the child."""
        status = self._zygote_status
        if status is None:
            return (self.pid, 0)
        if wait_flags & os.WNOHANG:
            ready, _, _ = select.select([status], [], [], 0)
            if not ready:
                return (0, 0)
        reply = status.recv(64)
        status.close()
        self._zygote_status = None
        if not reply.startswith(b"exit "):  # the server is gone: say killed, never a success nobody saw
            return (self.pid, signal.SIGKILL)
        fields = reply.split()
        if len(fields) > 2:
            _count_cpu(float(fields[2]))
        return (self.pid, int(fields[1]))

    def _internal_poll(self, _deadstate: Any = None, *_args: Any, **_kwargs: Any) -> int | None:
        if self.returncode is None:
            if not self._waitpid_lock.acquire(False):
                return None
            try:
                if self.returncode is not None:
                    return self.returncode
                pid, sts = self._try_wait(os.WNOHANG)
                if pid == self.pid:
                    self._handle_exitstatus(sts)
            finally:
                self._waitpid_lock.release()
        return self.returncode


# --- the server side ------------------------------------------------------------------------------------------


def _serve(control_fd: int) -> None:
    """Import torch, then fork a child per request until the control socket closes and every child was reaped."""
    import torch
    import torch.distributed  # noqa: F401

    control: socket.socket | None = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    assert control is not None
    control.send(b"ready")
    while control is not None or children:
        watched = [wake_r] if control is None else [wake_r, control]
        ready, _, _ = select.select(watched, [], [], 1.0)
        if control is not None and control in ready:
            msg, fds, _, _ = socket.recv_fds(control, 1 << 22, 8)
            if not msg:
                control.close()
                control = None
            else:
                conn = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    mine = [wake_r, wake_w, control.fileno(), conn.fileno(), *(c.fileno() for c in children.values())]
                    _child(json.loads(msg), fds[1:4], mine)
                for fd in fds[1:]:
                    os.close(fd)
                children[pid] = conn
                with contextlib.suppress(OSError):
                    conn.send(b"pid %d" % pid)
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_r, 4096):
                pass
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, sts, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the status, then the CPU seconds of the child and its reaped tree
                conn.send(b"exit %d %.3f" % (sts, usage.ru_utime + usage.ru_stime))
            conn.close()


def _child(request: dict[str, Any], stdio: list[int], server_fds: list[int]) -> None:
    """In the forked child: become ``python [options] program args`` and never return."""
    code = 1
    try:
        _setup(request, stdio, server_fds)
        code = _run(request["kind"], request["target"], request["argv"])
    except BaseException:  # the set-up failed: say why on the child's stderr, exit 1 as python would
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _setup(request: dict[str, Any], stdio: list[int], server_fds: list[int]) -> None:
    """The child's process state, streams and interpreter options, as ``python`` would have them at start."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in server_fds:
        os.close(fd)
    if request["session"]:
        os.setsid()
    elif request["pgroup"] >= 0:
        os.setpgid(0, request["pgroup"])
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    for fd in set(stdio):
        if fd > 2:
            os.close(fd)
    if request["hostname"] is not None:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).unshare(0x04000000) != 0:  # CLONE_NEWUTS
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS) for the host name")
        socket.sethostname(request["hostname"].encode())
    if request["cwd"] is not None:
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import random

    random.seed()
    _streams(unbuffered=request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED")))
    if request["faulthandler"] or os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    if request["warnings"]:
        import warnings

        sys.warnoptions.extend(request["warnings"])
        warnings._processoptions(request["warnings"])  # type: ignore[attr-defined]


def _streams(*, unbuffered: bool) -> None:
    """Standard streams over the new fds 0-2, buffered as a fresh interpreter would buffer them."""
    encoding = sys.__stdout__.encoding if sys.__stdout__ is not None else "utf-8"

    def writer(fd: int, *, stderr: bool) -> io.TextIOWrapper:
        binary: Any = io.FileIO(fd, "wb", closefd=False) if unbuffered else open(fd, "wb", closefd=False)  # noqa: SIM115
        return io.TextIOWrapper(
            binary,
            encoding=encoding,
            errors="backslashreplace" if stderr else "strict",
            line_buffering=stderr or os.isatty(fd),
            write_through=unbuffered,
        )

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False), encoding=encoding)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = writer(1, stderr=False)
    sys.stderr = sys.__stderr__ = writer(2, stderr=True)


def _run(kind: str, target: str, argv: list[str]) -> int:
    """Run the program as ``__main__``, then end as the interpreter would; the exit status."""
    import runpy

    interrupted = False
    try:
        if kind == "file":
            sys.argv = [target, *argv]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        elif kind == "-m":
            sys.argv = ["-m", *argv]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(target)  # type: ignore[attr-defined]
        else:
            import types

            sys.argv = ["-c", *argv]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        _excepthook()
        interrupted, code = True, 130
    except BaseException:
        _excepthook()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        interrupted = True
    import atexit as _atexit

    _atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # as CPython ends after an uncaught KeyboardInterrupt: by SIGINT, so the parent sees -2
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _excepthook() -> None:
    """Print the uncaught exception as ``python`` would: from the program's first frame, without this module's."""
    kind, exc, tb = sys.exc_info()
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__ or tb.tb_frame.f_globals.get("__name__") == "runpy"
    ):
        tb = tb.tb_next
    if kind is not None and exc is not None:
        # As PyErr_Print does for an uncaught exception: sys.last_* first (atexit handlers read them, e.g.
        # distinit's lost-rank report), then the hook, which prints the exception's own __traceback__.
        sys.last_type, sys.last_value, sys.last_traceback = kind, exc.with_traceback(tb), tb
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        sys.excepthook(kind, exc, tb)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
