"""MPI-style launchers: Open MPI, MPICH/Intel hydra, MVAPICH2, Cray PALS, LSF jsrun, Horovod, PMI/PMIx.

Each family is a small table of variable names. Several families are often present at once
(jsrun exports JSM + Open MPI + PMIx, cray_shasta exports PALS + PMI, srun --mpi=pmi2 exports PMI):
all present families must agree on rank and sizes, or the environment is contradictory.

None of them except PALS (``PALS_NODEID``) and Horovod (``HOROVOD_CROSS_RANK``) exports a node index.
``OMPI_COMM_WORLD_NODE_RANK`` is *not* one: it is the rank among this node's processes across jobs;
:mod:`distinit.env._layout` derives one from the layout where a rule holds, and says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from distinit.env._draft import Draft, Vars
from distinit.env._model import Launcher
from distinit.errors import ConflictingEnvError, IncompleteEnvError


@dataclass(frozen=True)
class Family:
    """The variable names one MPI-style launcher uses (``None``: it does not export that value)."""

    name: str
    launcher: Launcher
    rank: str
    size: str | None = None
    local_rank: str | None = None
    local_size: str | None = None
    node_rank: str | None = None
    num_nodes: str | None = None

    def variables(self) -> tuple[str, ...]:
        """Every variable name of the family."""
        names = (self.rank, self.size, self.local_rank, self.local_size, self.node_rank, self.num_nodes)
        return tuple(name for name in names if name is not None)


#: Most specific first: the first family present names the launcher.
FAMILIES: tuple[Family, ...] = (
    Family(
        "LSF jsrun",
        "lsf",
        "JSM_NAMESPACE_RANK",
        "JSM_NAMESPACE_SIZE",
        "JSM_NAMESPACE_LOCAL_RANK",
        "JSM_NAMESPACE_LOCAL_SIZE",
    ),
    Family("Cray PALS", "pals", "PALS_RANKID", None, "PALS_LOCAL_RANKID", None, "PALS_NODEID"),
    Family(
        "Horovod",
        "horovod",
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK",
        "HOROVOD_CROSS_SIZE",
    ),
    Family(
        "MVAPICH2",
        "mvapich2",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    Family(
        "Open MPI",
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    Family("MPICH hydra", "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    Family("PMI", "mpich", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
    Family("PMIx", "openmpi", "PMIX_RANK"),
)

#: Families that srun's own MPI plugins export (pmi2, pmix, cray_shasta): with a matching srun
#: step, srun is the launcher. Open MPI's, hydra's and MVAPICH2's variables mean a real mpirun.
SRUN_PLUGIN_FAMILIES = frozenset({"PMI", "PMIx", "Cray PALS"})

_FIELDS = ("rank", "size", "local_rank", "local_size", "node_rank", "num_nodes")


@dataclass
class MpiWorld:
    """The agreed values of every MPI family present, with the variable each came from."""

    families: tuple[Family, ...]
    values: dict[str, tuple[int, str]]

    @property
    def launcher(self) -> Launcher:
        """Short name of the most specific family present."""
        return self.families[0].launcher

    @property
    def srun_plugin_only(self) -> bool:
        """Whether only variables that srun's MPI plugins set are present."""
        return all(family.name in SRUN_PLUGIN_FAMILIES for family in self.families)

    def get(self, name: str) -> int | None:
        """The agreed value of ``name`` (a Family field name) or ``None``."""
        found = self.values.get(name)
        return None if found is None else found[0]

    def source(self, name: str) -> str:
        """The variable that gave ``name``."""
        return self.values[name][1]


def _present(v: Vars, family: Family) -> bool:
    if family.name == "MPICH hydra":
        return v.has("PMI_RANK") and v.has("MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if family.name == "PMI":
        return v.has("PMI_RANK", "PMI_SIZE") and not v.has("MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    return v.has(*family.variables())


def read(v: Vars) -> MpiWorld | None:
    """The MPI world all present families agree on, or ``None`` when no MPI-style launcher is present.

    Raises:
        ConflictingEnvError: two families disagree on a value.
        IncompleteEnvError: a family is present but no family gives the rank or the world size.
    """
    families = tuple(family for family in FAMILIES if _present(v, family))
    if not families:
        return None
    values: dict[str, tuple[int, str]] = {}
    for family in families:
        for field in _FIELDS:
            variable = getattr(family, field)
            if variable is None:
                continue
            number = v.integer(variable, minimum=1 if field in ("size", "local_size", "num_nodes") else 0)
            if number is None:
                continue
            if field in values and values[field][0] != number:
                other_value, other = values[field]
                raise ConflictingEnvError(
                    f"{other}={other_value} and {variable}={number} disagree on the {field.replace('_', ' ')}.",
                    variables=(other, variable),
                    why="two MPI launchers' variables are present and describe different worlds: usually one "
                    "was inherited from an outer launcher or exported by a job script.",
                    fix=f"remove the stale one from the job script (distinit reads {families[0].name}'s variables).",
                )
            values.setdefault(field, (number, variable))
    names = ", ".join(f"{family.name}" for family in families)
    if "rank" not in values:
        wanted = tuple(family.rank for family in families)
        raise IncompleteEnvError(
            f"{names} variables are present but none gives this process's rank ({', '.join(wanted)} unset).",
            variables=wanted,
            fix="start the processes with the MPI launcher itself (mpirun/mpiexec/jsrun), or export RANK.",
        )
    return MpiWorld(families=families, values=values)


def to_draft(mpi: MpiWorld, v: Vars) -> Draft:
    """A draft world from the MPI values alone (the caller adds scheduler facts).

    Raises:
        IncompleteEnvError: no family gives the world size (PMIx alone) or the local rank.
    """
    size = mpi.values.get("size")
    if size is None:
        raise IncompleteEnvError(
            f"{mpi.source('rank')} is set but no variable gives the world size.",
            variables=(mpi.source("rank"), "WORLD_SIZE"),
            why="PMIx publishes the size through its API only, not in the environment.",
            fix="launch with mpirun (Open MPI exports OMPI_COMM_WORLD_SIZE) or srun --mpi=pmix (Slurm exports "
            "SLURM_STEP_NUM_TASKS), or export WORLD_SIZE.",
        )
    draft = Draft(launcher=mpi.launcher, rank=mpi.get("rank") or 0, world_size=size[0])
    draft.sources.update(rank=(mpi.source("rank"),), world_size=(size[1],))
    for field, target in (
        ("local_rank", "local_rank"),
        ("local_size", "local_world_size"),
        ("node_rank", "node_rank"),
        ("num_nodes", "num_nodes"),
    ):
        if field in mpi.values:
            draft.put(target, mpi.get(field), mpi.source(field))
    if draft.local_rank is None:
        if draft.world_size == 1:
            draft.put("local_rank", 0, size[1])
        else:
            raise IncompleteEnvError(
                f"{mpi.families[0].name} gives rank {draft.rank} of {draft.world_size} but no local rank.",
                variables=tuple(f.local_rank for f in mpi.families if f.local_rank),
                fix="export LOCAL_RANK, or launch with a launcher that sets it (mpirun, mpiexec.hydra, srun).",
            )
    if draft.num_nodes is None:
        nodes = v.integer("OMPI_MCA_orte_num_nodes", minimum=1)
        if nodes is not None and mpi.launcher in ("openmpi", "lsf"):
            draft.put("num_nodes", nodes, "OMPI_MCA_orte_num_nodes")
    return draft


#: The variables an MPI launcher writes the number of processes it started to, innermost first. PMI_SIZE
#: comes last: srun's own PMI plugin sets it too, for the same step.
COUNTS = ("OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMI_SIZE")


def launched(v: Vars) -> tuple[str, int] | None:
    """``(variable, count)``: how many processes mpirun/mpiexec says it started; None when none says."""
    return v.first_count(*COUNTS)


def launch_id(v: Vars) -> str | None:
    """An id identical on every rank of one mpirun/mpiexec launch and different between launches."""
    found = v.first("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PALS_APID", "PMI_JOBID")
    return None if found is None else found[1]
