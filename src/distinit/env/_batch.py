"""PBS (Pro, Torque) and IBM LSF: batch schedulers whose own launchers (mpiexec, jsrun) give the ranks.

Their variables never give a rank. They name the job (``PBS_JOBID``, ``LSB_JOBID``), which keeps the
derived port of one job apart from another's, and LSF lists the job's hosts in ``LSB_MCPU_HOSTS``.
A process that sees only these variables is the batch script itself: one process.
"""

from __future__ import annotations

from dataclasses import dataclass

from distinit._text import decimal
from distinit.env._draft import Draft, Vars
from distinit.errors import MalformedEnvError


@dataclass(frozen=True)
class Batch:
    """The batch job this process belongs to, and the variable that names it."""

    job_var: str
    job_id: str


def read(v: Vars) -> Batch | None:
    """The LSF or PBS job, or ``None`` outside both (LSF first: it is more specific than a PBS_JOBID)."""
    found = v.first("LSB_JOBID", "PBS_JOBID")
    if found is None:
        return None
    return Batch(job_var=found[0], job_id=found[1])


def batch_note(v: Vars) -> str | None:
    """What a process of a PBS or LSF job without a launcher is, in words; ``None`` outside both."""
    if v.has("PBS_JOBID", "PBS_NODEFILE"):
        return "PBS batch script (PBS_JOBID) without mpiexec: one process."
    if v.has("LSB_JOBID"):
        return "LSF batch script (LSB_JOBID) without jsrun or mpirun: one process."
    return None


def lsf_hosts(v: Vars, draft: Draft) -> None:
    """Rank 0's host and the node count from ``LSB_MCPU_HOSTS`` ('host ncpu' pairs, launch node first).

    Raises:
        MalformedEnvError: the value is not a list of 'host slots' pairs.
    """
    text = v.text("LSB_MCPU_HOSTS")
    if text is None:
        return
    words = text.split()
    if len(words) % 2 or any(decimal(count) is None for count in words[1::2]):
        raise MalformedEnvError(
            f"LSB_MCPU_HOSTS={v.quoted('LSB_MCPU_HOSTS')} is not a list of 'host slots' pairs.",
            variables=("LSB_MCPU_HOSTS",),
            fix="do not override LSB_MCPU_HOSTS; LSF sets it.",
        )
    hosts = words[0::2]
    compute = hosts[1:] if len(hosts) > 1 else hosts
    draft.put("master_addr", compute[0], "LSB_MCPU_HOSTS")
    if draft.num_nodes is None:
        draft.put("num_nodes", len(compute), "LSB_MCPU_HOSTS")
    draft.note("LSB_MCPU_HOSTS: the first host is jsrun's launch node; rank 0 is assumed on the first compute host.")
