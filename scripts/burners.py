"""Run a command beside CPU burners: busy-looping processes, ``--per-core`` (default 2) for each core.

``make test-stress`` runs the README's test command this way, and ``scripts/flakes.py`` reruns tests this way:
every test must pass on a machine that is busy with something else (a CI runner's neighbours, a developer's
build). The burners are started here and stopped here, by pid, whatever the command does; their nice value is
0, like the tests', so they really compete for the CPU.

They stay in the caller's session, so each counts as one more busy process beside the tests, whatever the kernel's
scheduler does with sessions. Linux's autogroup (``/proc/sys/kernel/sched_autogroup_enabled``, 1 on this project's
machines) shares the CPU between sessions first, then between the processes of each: the burners once started a
session each, and 4 burners on 2 cores then took 4/5 of the machine, not 4 processes' share. Beside them the 4
ranks of an mpirun test got 0.1 core each (``ps`` showed 5-6 CPU-s each after 58 s, all runnable) and the
launch took 69-72 s, not 23 s; the stress round's missed hang guards came from there (issue 34).

    python scripts/burners.py [--per-core N] -- COMMAND [ARG...]

Exit status: the command's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: The busy loop each burner runs (plain Python: no dependency, nothing written anywhere). It ends by itself once
#: its parent is gone: a parent killed by SIGKILL (a test's timeout) cannot stop its burners, and an orphaned
#: burner would load the machine for good.
LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(100_000): pass"


@contextmanager
def burning(per_core: int = 2) -> Iterator[list[int]]:
    """Keep ``per_core`` x ``os.cpu_count()`` burners running for the ``with`` block; yield their pids."""
    count = per_core * (os.cpu_count() or 1)
    # No start_new_session: a session of its own is a scheduling group of its own under autogroup (module doc).
    procs = [subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    """Run the command beside the burners; its exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-core", type=int, default=2, help="burners per core (default 2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run beside them (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    with burning(args.per_core) as pids:
        print(f"burners: {len(pids)} busy loops beside the command (pids {pids[0]}..{pids[-1]})", flush=True)
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
