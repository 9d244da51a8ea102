"""The ``distinit`` command: the only module that prints or configures logging.

``distinit env`` prints the resolved world (``--json``, ``--explain``, ``--export-shell``) and can check
it for real (``--check``: form a gloo group with the exported values and verify every rank appears once).
``distinit watchdog serve`` runs the watchdog daemon until SIGTERM/SIGINT (see docs/watchdog.md).
``distinit doctor`` checks every rank and the world as a whole before a job (see docs/doctor.md).
Exit status: 0 ok, 2 bad environment or set-up error, 3 the world check of ``env --check`` failed;
``doctor``: 0 nothing failed (warnings allowed), 1 a check failed, 2 bad environment.

``--help`` must answer at once (issue 27: <= 0.3 s): this module imports only the stdlib at the top. pydantic,
torch and the checks are imported by the handler of the command that runs, and the watchdog's parser
(``distinit.watchdog`` imports pydantic) only when the command line names ``watchdog``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distinit._duration import to_seconds
from distinit._foreign import first_line
from distinit.errors import DistinitError, RendezvousError, SchedulerEnvError

if TYPE_CHECKING:
    from distinit.env import DistEnv

EXIT_OK = 0
EXIT_BAD_ENV = 2
EXIT_CHECK_FAILED = 3

_FIELDS = (
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
    "launcher",
    "job_id",
    "restart_count",
    "launched",
    "agent_store",
)


def _explain(env: DistEnv) -> str:
    lines = [f"distinit env: rank {env.rank} of {env.world_size}, launcher {env.launcher}"]
    width = max(len(name) for name in _FIELDS)
    for name in _FIELDS:
        value = getattr(env, name)
        shown = "unknown" if value is None else str(value)
        origin = ", ".join(env.sources.get(name, ())) or ("-" if value is not None else "")
        lines.append(f"  {name:<{width}}  {shown:<20}  {origin}".rstrip())
    if env.notes:
        lines.append("  notes:")
        lines.extend(f"    - {note}" for note in env.notes)
    exported = " ".join(f"{key}={value}" for key, value in env.to_environ().items())
    lines.append(f"  exports: {exported}")
    return "\n".join(lines)


def _export_shell(env: DistEnv) -> str:
    return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in env.to_environ().items())


def check_world(env: DistEnv, *, timeout: float) -> dict[str, Any]:
    """Form a real gloo group from ``env`` (exported first) and verify the world it describes.

    Every rank all-reduces its rank and all-gathers its identity (rank, local rank, node rank,
    host, pid) as JSON bytes in a fixed-size uint8 tensor: no pickle crosses the wire. The check
    passes when the sum matches, every rank appears exactly once, and no two ranks share a
    (node, local rank) pair.

    Raises:
        SchedulerEnvError: MASTER_ADDR or MASTER_PORT is unknown for a multi-process world.
        RendezvousError: the world did not form within ``timeout`` (duplicate rank, world-size mismatch,
            missing ranks...), as :func:`distinit.init_with_retry` says.
    """
    _require_master(env)
    import torch  # only now: a refused check above stays fast
    import torch.distributed as dist

    from distinit.doctor import destroy_world, gather_json
    from distinit.init import init_with_retry

    env.export()
    # Through init/ like any job: the join protocol names duplicate ranks and world-size mismatches in
    # seconds, and the deadline bounds the whole rendezvous.
    init_with_retry("gloo", env=env, deadline=timeout, pg_timeout=timeout, verify=False)
    try:
        total = torch.tensor([env.rank], dtype=torch.int64)
        dist.all_reduce(total)
        identity = [env.rank, env.local_rank, env.node_rank, socket.gethostname()[:200], os.getpid()]
        peers = gather_json(identity, world_size=env.world_size, timeout=timeout)
    finally:
        destroy_world()
    return _judge(env, int(total.item()), peers)


def _require_master(env: DistEnv) -> None:
    """Raise when a multi-process world has no rendezvous endpoint."""
    missing = tuple(
        name for name, value in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port)) if value is None
    )
    if env.world_size > 1 and missing:
        raise SchedulerEnvError(
            f"cannot check a {env.world_size}-process world: {' and '.join(missing)} unknown.",
            variables=missing,
            fix="pass them to every process, e.g. `mpirun -x MASTER_ADDR=<rank 0 host> -x MASTER_PORT=<port>`.",
        )


def _judge(env: DistEnv, total: int, peers: list[Any]) -> dict[str, Any]:
    """The verdict of ``env --check`` from the all-reduced rank sum and every rank's identity."""
    expected = env.world_size * (env.world_size - 1) // 2
    problems = []
    if total != expected:
        problems.append(f"all_reduce of ranks gave {total}, expected {expected}")
    ranks = sorted(peer[0] for peer in peers)
    if ranks != list(range(env.world_size)):
        problems.append(f"ranks seen {ranks}, expected each of 0..{env.world_size - 1} once")
    slots = [(peer[2], peer[1]) for peer in peers if peer[2] is not None]
    if len(set(slots)) != len(slots):
        problems.append(f"two ranks share a (node_rank, local_rank) pair: {sorted(slots)}")
    return {
        "ok": not problems,
        "problems": problems,
        "all_reduce_sum": total,
        "expected_sum": expected,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "peers": peers,
    }


def _cmd_env(args: argparse.Namespace) -> int:
    from distinit.env import env_from_scheduler

    try:
        env = env_from_scheduler(strict=not args.no_strict)
    except SchedulerEnvError as exc:
        print(f"distinit env: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    check: dict[str, Any] | None = None
    if args.check:
        try:
            check = check_world(env, timeout=args.check_timeout)
        except SchedulerEnvError as exc:
            print(f"distinit env: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_BAD_ENV
        except RendezvousError as exc:  # the world did not form: the check failed, and says why
            check = {"ok": False, "problems": [f"{type(exc).__name__}: {exc}"]}
        except (RuntimeError, ValueError, OSError) as exc:  # torch reports collective failures as these
            check = {"ok": False, "problems": [f"{type(exc).__name__}: {first_line(exc)}"]}
    if args.json:
        document = env.model_dump(mode="json")
        if check is not None:
            document["check"] = check
        out = json.dumps(document, sort_keys=True)
    elif args.export_shell:
        out = _export_shell(env)
    else:
        out = _explain(env) if args.explain else " ".join(f"{k}={v}" for k, v in env.to_environ().items())
        if check is not None:
            verdict = "ok" if check["ok"] else "FAILED: " + "; ".join(check["problems"])
            out += f"\n  check: {verdict}"
            if check["ok"] and env.rank == 0:
                out += f" ({env.world_size} ranks formed a gloo group; all_reduce and all_gather agree)"
    # One write per process, so ranks launched together do not interleave mid-block.
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
    return EXIT_OK if check is None or check["ok"] else EXIT_CHECK_FAILED


def _seconds(text: str) -> float:
    """An argparse type: finite seconds > 0 (argparse then exits 2 with the message, never a traceback)."""
    try:
        return to_seconds(float(text), "S")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds > 0") from exc


#: The doctor's check ids, in report order (``distinit.doctor._model.ALL_IDS``; a unit test keeps them equal).
#: Spelled here so that ``--help`` does not import the doctor (pydantic, torch).
DOCTOR_IDS = (
    *("env", "limits", "shm", "host", "names", "route", "gpu"),
    *("world", "consensus", "clock", "nodes", "reach", "bandwidth", "nccl"),
)
WATCHDOG_HELP = "same-host watchdog that kills hung workers"


def _ids(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated doctor check ids."""
    ids = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [i for i in ids if i not in DOCTOR_IDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check id(s) {unknown}; the ids are {', '.join(DOCTOR_IDS)}")
    return ids


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``distinit doctor`` (and ``python -m distinit.doctor``) on ``parser``."""
    parser.add_argument("--json", action="store_true", help="one JSON document per rank (rank 0: the world)")
    parser.add_argument("--timeout", type=_seconds, default=60.0, metavar="S", help="bound for everything (60 s)")
    parser.add_argument("--bandwidth", action="store_true", help="also time 64 MiB between neighbouring hosts")
    parser.add_argument("--nccl", action="store_true", help="also one small NCCL all_reduce (GPU machines)")
    parser.add_argument("--skip", type=_ids, action="append", default=[], metavar="ID,...", help="check ids not to run")
    parser.add_argument("--no-strict", action="store_true", help="treat 'not launched' as a single process")
    parser.set_defaults(handler=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from distinit.doctor import run_from_args  # torch and the checks: only when the doctor runs

    return run_from_args(args)


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names (its first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``distinit`` argument parser for ``argv`` (default ``sys.argv[1:]``).

    The watchdog's real parser is added only when ``argv`` names ``watchdog`` (it imports pydantic); any other
    command line gets a stand-in that lists it in ``--help``.
    """
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="distinit",
        description="torch.distributed start-up that survives real launchers: resolve and check the world, "
        "run the watchdog daemon, check a whole world before a job (doctor).",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("env", help="print the torch world resolved from launcher variables")
    shape = env.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="one JSON line with every field, sources and notes")
    shape.add_argument("--explain", action="store_true", help="where each value came from, and every note")
    shape.add_argument("--export-shell", action="store_true", help="`export NAME=value` lines for eval")
    env.add_argument("--no-strict", action="store_true", help="treat 'not launched' as a single process")
    env.add_argument("--check", action="store_true", help="form a real gloo group and verify the world")
    env.add_argument("--check-timeout", type=_seconds, default=60.0, metavar="S", help="bound for --check (60 s)")
    env.set_defaults(handler=_cmd_env)
    if _command_of(argv) == "watchdog":
        from distinit.watchdog import add_watchdog_parser

        add_watchdog_parser(commands)
    else:
        commands.add_parser("watchdog", help=WATCHDOG_HELP)
    doctor = commands.add_parser(
        "doctor",
        help="find what will make a distributed job hang, before it runs (run it on every rank)",
        description="Local checks on every rank, then world checks through one gloo group. "
        "Exit 0: nothing failed; 1: a check failed; 2: bad environment. See docs/doctor.md.",
    )
    add_doctor_arguments(doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``distinit`` command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    # The watchdog daemon's lifecycle events (started, adopted, exited while armed) are INFO.
    verbosity = args.verbose + (1 if args.command == "watchdog" else 0)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbosity, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        status: int = args.handler(args)
    except DistinitError as exc:
        print(f"distinit: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    return status


if __name__ == "__main__":
    sys.exit(main())
