"""``distinit watchdog serve``: the server as a standalone daemon that runs until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from types import FrameType

from distinit._duration import to_seconds
from distinit.watchdog._server import WatchdogServer
from distinit.watchdog._timer_server import FileTimerServer


def serve(
    path: str | None = None,
    *,
    grace: float = 5.0,
    events: str | None = None,
    dump_stacks: bool = True,
    kill_group: bool = False,
    resolution: float = 0.02,
    group_window: float = 1.0,
    victim_hold: float = 2.0,
    torch_fifo: str | None = None,
    workers_of: int | None = None,
) -> int:
    """Run a :class:`WatchdogServer` in this process until SIGTERM or SIGINT; returns the exit status (0).

    With ``torch_fifo``, a :class:`~distinit.watchdog.elastic.FileTimerServer` also serves torch's
    ``FileTimerClient`` (and distinit's drop-in) on that FIFO, for jobs that keep torch's timer API; its
    workers are judged with the same ``group_window`` and ``victim_hold`` (culprit first); it signals only
    processes that hold the FIFO open, started with ``TORCHELASTIC_TIMER_FILE`` naming it, or descend from
    ``workers_of`` (the launcher's pid). The watchdog
    directory is removed on return when this server created it and it is empty.
    Must be called from the main thread (it installs the signal handlers, and restores them on return).

    Raises:
        WatchdogError: the server could not start (see :meth:`WatchdogServer.start`), or the FIFO or the
            events file was refused.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with WatchdogServer(
            path,
            grace=grace,
            dump_stacks=dump_stacks,
            events=events,
            kill_group=kill_group,
            resolution=resolution,
            group_window=group_window,
            victim_hold=victim_hold,
        ) as server:
            timers = None
            if torch_fifo is not None:  # judged as the native server judges: the same window, hold and dumps
                timers = FileTimerServer(
                    torch_fifo,
                    "distinit-watchdog-serve",
                    max_interval=1.0,
                    events=events,
                    dump_timeout=server.ladder.dump_timeout if dump_stacks else 0.0,
                    group_window=group_window,
                    victim_hold=victim_hold,
                    worker_parent=workers_of,
                )
                timers.start()
            try:
                while not stop.wait(1.0):
                    pass
            finally:
                if timers is not None:
                    timers.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _seconds(*, allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a number of seconds under the one duration policy (a bad value is a usage error)."""

    def parse(text: str) -> float:
        try:
            return to_seconds(float(text), "the value", allow_zero=allow_zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options: --path, --grace, --events, --no-dump-stacks, --kill-group, --resolution...

    ...and --group-window, --victim-hold (how workers that expire together are judged and killed).
    """
    parser.add_argument(
        "--path",
        default=None,
        help="watchdog directory (default: $DISTINIT_WATCHDOG, else distinit-watchdog-<uid>[-job-<id>] under "
        "$XDG_RUNTIME_DIR or /dev/shm)",
    )
    parser.add_argument(
        "--grace", type=_seconds(allow_zero=True), default=5.0, help="seconds between SIGTERM and SIGKILL (default 5)"
    )
    parser.add_argument("--events", default=None, help="append one JSON line per event to this file")
    parser.add_argument(
        "--no-dump-stacks",
        dest="dump_stacks",
        action="store_false",
        help="do not ask workers for a stack dump before killing them",
    )
    parser.add_argument(
        "--kill-group",
        action="store_true",
        help="also signal the process group the worker leads (never a group it shares with its launcher)",
    )
    parser.add_argument(
        "--resolution",
        type=_seconds(allow_zero=False),
        default=0.02,
        help="longest sleep between deadline checks, seconds (default 0.02)",
    )
    parser.add_argument(
        "--group-window",
        type=_seconds(allow_zero=True),
        default=1.0,
        help="judge workers whose deadlines fall within this many seconds of one another together, culprit "
        "first (default 1; 0: kill each expired worker alone at once)",
    )
    parser.add_argument(
        "--victim-hold",
        type=_seconds(allow_zero=True),
        default=2.0,
        help="seconds between killing the culprit and killing the victims still in their region (default 2)",
    )
    parser.add_argument(
        "--torch-fifo",
        default=None,
        metavar="PATH",
        help="also serve torch's FileTimerClient on this FIFO (created 0600; e.g. the path workers read from "
        "$TORCHELASTIC_TIMER_FILE): the requested signal, after a stack dump when the worker allows it; workers "
        "that expire together are judged with --group-window and --victim-hold, culprit first",
    )
    parser.add_argument(
        "--workers-of",
        type=int,
        default=None,
        metavar="PID",
        help="with --torch-fifo: the processes under this pid (e.g. torchrun's) are workers; without it a worker "
        "must hold the FIFO open or have started with TORCHELASTIC_TIMER_FILE naming it (other pids are refused)",
    )


# The parsed ``serve`` options passed on to :func:`serve` by name (all but ``--path``).
_SERVE_OPTIONS = (
    "grace",
    "events",
    "dump_stacks",
    "kill_group",
    "resolution",
    "group_window",
    "victim_hold",
    "torch_fifo",
    "workers_of",
)


def run_from_args(args: argparse.Namespace) -> int:
    """Run :func:`serve` with parsed ``serve`` arguments."""
    return serve(args.path, **{name: getattr(args, name) for name in _SERVE_OPTIONS})


def add_watchdog_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``watchdog serve`` on a CLI's subparsers; the parsed namespace's ``handler`` runs it."""
    wd = subparsers.add_parser("watchdog", help="same-host watchdog that kills hung workers")
    sub = wd.add_subparsers(dest="watchdog_command", required=True)
    serve_parser = sub.add_parser("serve", help="run the watchdog server until SIGTERM/SIGINT")
    add_serve_arguments(serve_parser)
    serve_parser.set_defaults(handler=run_from_args)
