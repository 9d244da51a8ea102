"""The MASTER_PORT policy: what a valid port is, where derived ports land, what to advise (and how to pass MASTER_ADDR).

The one home of these numbers for the whole package, so a leaf (the standard library and ``errors`` only):
env's resolver checks exported ports and derives ports with it, ``init``'s pre-flight check uses
:func:`check_port`, and the Lightning integration gives :data:`PORT_ADVICE` when no port is known. Not public:
the wording of the advice may change in any release.
"""

from __future__ import annotations

import hashlib

from distinit.errors import MalformedEnvError

#: A TCP port number: 0 means "any port" to bind(), so a rendezvous cannot use it.
PORT_MIN, PORT_MAX = 1, 65535

#: Derived ports land here: above the classic 10000-19999 service ports that Lightning and ignite
#: use (15000 + job id digits), below Linux's default ephemeral range (32768-60999) so the kernel
#: never hands the port to an outgoing connection (NVIDIA/enroot#243).
DERIVED_PORTS = (20000, 32767)

#: What to tell a user who must choose MASTER_PORT by hand.
PORT_ADVICE = (
    f"export MASTER_PORT as a free port, the same on every process and different for each job, e.g. between "
    f"{DERIVED_PORTS[0]} and {DERIVED_PORTS[1]} (below Linux's ephemeral range 32768-60999, which outgoing "
    "connections take)."
)


def check_port(port: int, *, variable: str = "MASTER_PORT", where: str = "") -> None:
    """Raise unless ``port`` is a TCP port (1-65535).

    Args:
        port: the port number read from ``variable``.
        variable: the variable named in the error.
        where: appended to the first line of the error, e.g. ``" on host H, pid P"`` or ``" (rank 3)"``.

    Raises:
        MalformedEnvError: ``port`` is outside 1-65535.
    """
    if PORT_MIN <= port <= PORT_MAX:
        return
    shown = port if port.bit_length() <= 64 else "a number of more than 20 digits"
    raise MalformedEnvError(
        f"{variable}={shown} is not a TCP port ({PORT_MIN}-{PORT_MAX}){where}.",
        variables=(variable,),
        why="a typo, or a port computed from a job id without a modulo.",
        fix=PORT_ADVICE,
    )


def derived_port(*parts: str) -> int:
    """A port in :data:`DERIVED_PORTS` that is a pure function of ``parts`` (job id, step id).

    Identical on every rank (no rank, host or time in the hash) and different for concurrent
    steps of one job, unlike ``15000 + last 4 digits of the job id``.
    """
    # surrogatepass: os.environ holds undecodable bytes as lone surrogates, which plain encode() rejects.
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).digest()
    low, high = DERIVED_PORTS
    return low + int.from_bytes(digest[:8], "big") % (high - low + 1)


#: How to pass rank 0's host to every process, per launcher (the default: export it).
_PASS_MASTER_ADDR: dict[str, str] = {
    "openmpi": "`mpirun -x MASTER_ADDR=<host of rank 0> ...`",
    "mpich": "`mpiexec -genv MASTER_ADDR <host of rank 0> ...`",
    "mvapich2": "`mpiexec -genv MASTER_ADDR <host of rank 0> ...` (or MASTER_ADDR=<host> on the mpirun_rsh line)",
    "lsf": "`jsrun -E MASTER_ADDR=<host of rank 0> ...`",
    "pals": "`mpiexec --env MASTER_ADDR=<host of rank 0> ...`",
    "slurm": "`export MASTER_ADDR=<host of rank 0>` before srun (srun passes it to every task)",
}


def master_addr_fix(launcher: str) -> str:
    """How to give every process of ``launcher`` rank 0's host, in words with the command."""
    how = _PASS_MASTER_ADDR.get(launcher, "`export MASTER_ADDR=<host of rank 0>` for every process")
    return f"pass rank 0's host name or address to every process: {how}."
