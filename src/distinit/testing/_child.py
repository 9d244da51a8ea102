"""The rank side of ``run_distributed``: a worker process that runs tasks sent by the parent.

A worker is started through the ``forkserver`` start method (torch is preloaded there, so a rank
starts in tens of milliseconds). It puts itself in its own process group (a ^C in the terminal
reaches the test process, which tears the ranks down, not the ranks directly) and makes itself a
child subreaper, so everything it spawns stays in its tree (``_tree``), even descendants that start
their own session. It registers ``faulthandler`` on ``SIGUSR1`` so the parent can ask for its
Python stacks, then loops: receive a :class:`Task`, run it, report. A one-shot worker exits after
its task; a pooled worker (``reuse=True``) waits for the next one. Exiting, it kills and reaps
what it spawned.

Messages to the parent are tuples of plain values (``("phase", name)``, ``("ok", bytes)``,
``("error", phase, type_name, message, traceback_text)``, ``("skip", reason)``). The return value
is pickled here and unpickled by the parent that started this process.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import ctypes
import faulthandler
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TextIO

from distinit._foreign import first_line
from distinit.testing._tree import become_subreaper, reap_own_tree

__all__ = ["ModuleHint", "Task", "worker_main"]

_PR_SET_PDEATHSIG = 1
_HARNESS_DIR = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class ModuleHint:
    """Where the child finds the module that defines the function (or the test).

    Attributes:
        name: the module name as the parent knows it (``sys.modules`` key).
        file: the module's source file, used when ``name`` is not importable from ``sys.path``
            (pytest's ``importlib`` import mode, ``__main__`` scripts).
        rewrite_asserts: load the file with pytest's assertion rewriting, as pytest did in the parent.
    """

    name: str
    file: str | None
    rewrite_asserts: bool = False


@dataclass(frozen=True)
class Task:
    """One rank's share of one ``run_distributed`` call."""

    run_id: str
    rank: int
    world_size: int
    backend: str
    timeout: float
    payload: bytes
    modules: tuple[ModuleHint, ...]
    env: dict[str, str]
    store: tuple[str, str, int]
    init: bool
    out_dir: str
    gpus_per_rank: int = 0


def worker_main(conn: Connection, parent_pid: int, reuse: bool) -> None:
    """Run tasks received on ``conn`` until told to stop (``None``) or after one task when not reusing."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    become_subreaper()
    _die_with_parent(parent_pid)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break
        if task is None:
            break
        if not _run_task(conn, task):
            # Stay alive, process group intact, until the parent has collected the other ranks and
            # kills this one: exiting now would fail the peers with "Connection closed by peer" and
            # hide where they were.
            with contextlib.suppress(EOFError, OSError):
                conn.recv()
            break
        if not reuse:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("phase", "exit"))
            break
    _exit_process()


def _exit_process() -> None:
    """Exit like a normal interpreter would (atexit handlers, flushed streams), leaving no descendant behind."""
    code = 0
    try:
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    reap_own_tree()
    os._exit(code)


def _die_with_parent(parent_pid: int) -> None:
    """Kill this rank and its descendants when the test process dies (pytest-timeout's thread method, ^C)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    server_pid = os.getppid()  # the fork server; it exits when the test process goes away

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(parent_pid, 0)
                gone = os.getppid() != server_pid  # reparented: a dead test process may linger as a zombie
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
            if gone:
                reap_own_tree(timeout=1.0)
                os._exit(1)

    threading.Thread(target=watch, name="distinit-parent-watch", daemon=True).start()


def _redirect_output(out_dir: str, rank: int) -> TextIO:
    """Point fd 1 and 2 at this rank's files, line-buffered so a SIGKILL loses nothing printed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(os.path.join(out_dir, f"rank{rank}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):
                reconfigure(line_buffering=True, write_through=True)
    stacks = open(os.path.join(out_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115 - lives with the task
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    return stacks


def _load_module(hint: ModuleHint) -> None:
    """Make ``hint.name`` importable in this process, as the parent had it."""
    if hint.name in sys.modules and hint.name != "__main__":
        return
    if hint.name == "__main__":
        if hint.file is None:
            return
        _exec_file("__mp_main__", hint.file, rewrite=False)
        sys.modules["__main__"] = sys.modules["__mp_main__"]
        return
    if not hint.rewrite_asserts:
        try:
            importlib.import_module(hint.name)
            return
        except ImportError:
            if hint.file is None:
                raise
    elif hint.file is None:
        importlib.import_module(hint.name)
        return
    parent, _, _ = hint.name.rpartition(".")
    if parent:
        with contextlib.suppress(ImportError):
            importlib.import_module(parent)
    _exec_file(hint.name, hint.file, rewrite=hint.rewrite_asserts)


def _exec_file(name: str, file: str, *, rewrite: bool) -> None:
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load module {name!r} from {file!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if rewrite:
            source = Path(file).read_bytes()
            tree = ast.parse(source, filename=file)
            try:
                from _pytest.assertion.rewrite import rewrite_asserts

                rewrite_asserts(tree, source, file, None)
            except ImportError:
                pass
            code = compile(tree, file, "exec", dont_inherit=True)
            exec(code, module.__dict__)
        else:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def _connect_store(task: Task) -> Any:
    from torch.distributed import FileStore, PrefixStore, Store, TCPStore

    kind, where, port = task.store
    timeout = timedelta(seconds=task.timeout)
    store: Store
    if kind == "file":
        store = FileStore(where, task.world_size)
        store.set_timeout(timeout)
    else:
        store = TCPStore(where, port, is_master=False, timeout=timeout)
    return PrefixStore(task.run_id, store)


def _run_task(conn: Connection, task: Task) -> bool:
    """Run one task; report through ``conn``. Returns whether it succeeded."""
    phase = "start"
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    stacks = _redirect_output(task.out_dir, task.rank)
    try:
        os.environ.clear()
        os.environ.update(task.env)
        phase = "import"
        conn.send(("phase", phase))
        for hint in task.modules:
            _load_module(hint)
        fn, args, kwargs = pickle.loads(task.payload)
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or "1")))
        if task.init:
            phase = "init"
            conn.send(("phase", phase))
            _init_group(task)
        phase = "run"
        conn.send(("phase", phase))
        result = fn(*args, **kwargs)
        phase = "return"
        try:
            data = pickle.dumps(result)
        except Exception as exc:
            raise TypeError(f"the return value of rank {task.rank} cannot be pickled: {exc}") from exc
        phase = "teardown"
        # Also a group the test made itself (init=False): a pooled rank must start the next test clean.
        _teardown_group()
        conn.send(("ok", data))
        return True
    except BaseException as exc:
        outcome = _outcome(exc)
        if outcome is not None:
            conn.send(outcome)
        else:
            conn.send(("error", phase, _type_name(exc), _summary_line(exc), _format_exception(exc)))
        return False
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # A failed rank keeps its process group: destroying it would close its gloo pairs and turn
        # every peer's wait into a "Connection closed by peer" error that hides where the peers were.
        faulthandler.unregister(signal.SIGUSR1)
        stacks.close()
        os.environ.clear()
        os.environ.update(saved_env)
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)


def _init_group(task: Task) -> None:
    """Form the default process group of this run on the run's store."""
    import torch
    from torch import distributed as dist

    if task.gpus_per_rank > 0 and torch.cuda.is_available():
        torch.cuda.set_device(task.rank * task.gpus_per_rank)
    dist.init_process_group(
        task.backend,
        store=_connect_store(task),
        rank=task.rank,
        world_size=task.world_size,
        timeout=timedelta(seconds=task.timeout),
    )
    # gloo's init can return on one rank before its peers finished connectFullMesh; a rank that
    # then finishes the test and exits fails its peers' init ("Connection closed by peer", seen
    # under xdist). One barrier makes every rank fully connected first.
    dist.barrier()


def _teardown_group() -> None:
    from torch import distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _outcome(exc: BaseException) -> tuple[str, str] | None:
    """``("skip", reason)`` / ``("xfail", reason)`` for pytest.skip() / pytest.xfail() raised on a rank."""
    outcomes = sys.modules.get("_pytest.outcomes")
    if outcomes is None:
        return None
    for kind, cls_name in (("skip", "Skipped"), ("xfail", "XFailed")):
        cls = getattr(outcomes, cls_name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return kind, str(getattr(exc, "msg", "") or exc)
    return None


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _summary_line(exc: BaseException) -> str:
    """The exception's first line for the summary (empty when it has no text; ``sys.exit(3)`` for SystemExit)."""
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    return first_line(str(exc), empty="")


def _format_exception(exc: BaseException) -> str:
    """The traceback without the harness's frames (the user's code starts at the top)."""
    tb = exc.__traceback__
    while tb is not None and _is_harness(tb.tb_frame.f_code.co_filename) and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _is_harness(filename: str) -> bool:
    return os.path.dirname(os.path.normcase(os.path.abspath(filename))) == _HARNESS_DIR
