"""The watchdog directory: its default location and the check that it is private to this user.

The default is per user and per job, and prefers ``$XDG_RUNTIME_DIR`` (a 0700 directory of this user that
nobody else can pre-empt) over ``/dev/shm`` (shared: another user can create the name first; the check
below then names that user).

Reads launcher variables itself: only the scheduler's job id (``SLURM_JOB_ID``, ...), the one value the daemon
in the job script and every worker of the job share; the daemon runs outside any launch, where
``env_from_scheduler`` refuses a batch script or describes another world.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import stat
import tempfile
from collections.abc import Mapping

from distinit.errors import WatchdogError
from distinit.watchdog._protocol import ENV_VAR

#: Scheduler job ids, in order: the same value reaches the daemon (job script) and every worker (job step).
JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def job_id(environ: Mapping[str, str]) -> str | None:
    """The scheduler's job id, made safe for a file name (None outside a scheduler job)."""
    for name in JOB_ID_VARS:
        value = environ.get(name, "").strip()
        if value:
            return _UNSAFE.sub("_", value)[:64]
    return None


def _is_private_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def default_path(environ: Mapping[str, str] | None = None) -> str:
    """``$DISTINIT_WATCHDOG``, else a per-user, per-job directory.

    The parent is ``$XDG_RUNTIME_DIR`` when it is a 0700 directory of this user, else ``/dev/shm`` (or the
    temporary directory). The name is ``distinit-watchdog-<uid>``, plus ``-job-<id>`` inside a Slurm, PBS,
    LSF or Flux job, so two jobs of one user on a host never share a directory.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_VAR)
    if explicit:
        return explicit
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and _is_private_dir(runtime):
        base = runtime
    else:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    job = job_id(env)
    name = f"distinit-watchdog-{os.geteuid()}" + (f"-job-{job}" if job else "")
    return os.path.join(base, name)


def user_name(uid: int) -> str:
    """``uid 1001 (alice)``, or ``uid 1001`` when the name is unknown."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def private_dir_problem(path: str) -> str | None:
    """Why ``path`` is not a private watchdog directory of this user (None if it is one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path!r} does not exist"
    except OSError as exc:
        return f"cannot inspect {path!r}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path!r} is not a directory"
    if st.st_uid != os.geteuid():
        return (
            f"{path!r} belongs to {user_name(st.st_uid)}, not to this process's {user_name(os.geteuid())}: "
            "another user created it first"
        )
    if st.st_mode & 0o077:
        return f"{path!r} has mode {st.st_mode & 0o777:o}; the watchdog needs 0700"
    return None


def _create(path: str) -> tuple[str | None, tuple[int, int] | None]:
    """Create ``path`` (0700, and its missing parents) if missing: (why it cannot serve, its id if made now).

    The id (device, inode) is returned only when this call created ``path`` itself (``mkdir`` is atomic: a
    directory someone else made first is never claimed).
    """
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            made = None
        else:
            st = os.lstat(path)
            made = (st.st_dev, st.st_ino)
    except OSError as exc:
        return f"cannot create the watchdog directory {path!r}: {exc.strerror or exc}", None
    return private_dir_problem(path), made


def prepare(path: str) -> str | None:
    """Create ``path`` (0700) if missing; why it cannot serve as the watchdog directory (None: it can)."""
    return _create(path)[0]


def remove_if_made(path: str, made: tuple[int, int] | None) -> None:
    """Remove the directory ``path`` if it is empty and still the one made as ``made`` (its device, inode).

    Never a directory that existed before (``made`` None) nor one that replaced it; one that holds anything
    (slot tables a later server adopts, stack files events name) is kept (``rmdir`` removes only empty ones).
    """
    if made is None:
        return
    with contextlib.suppress(OSError):  # not empty, gone, or no longer ours to remove
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == made:
            os.rmdir(path)


def require_servable(path: str) -> tuple[int, int] | None:
    """Create ``path`` if missing and make sure a server may serve it; its id when this call created it.

    Raises:
        WatchdogError: another user owns it (naming that user), its mode lets others in, or it cannot be
            created.
    """
    problem, made = _create(path)
    if problem is None:
        return made
    if "another user created it" in problem:
        why = (
            "while another user owns this directory no watchdog can run there, and every client of this job "
            "fails open: someone guessed the path first (or a stale directory of another job)"
        )
        fix = (
            "have that user (or root) remove it, or choose a path under a directory only you can write "
            "(--path, DISTINIT_WATCHDOG; the default uses $XDG_RUNTIME_DIR when it exists)"
        )
    elif problem.startswith("cannot create"):
        why, fix = "", "pass a path in a writable directory (WatchdogServer(path=...) or --path)"
    else:
        why = "another user could plant slot tables or reach the socket, and make the server kill"
        fix = f"chmod 700 {path} (and make it yours), or choose another --path"
    raise WatchdogError(f"refusing to serve: {problem}", why=why, fix=fix)
