"""scripts/suite_acct.py reads the kernel's accounting records and says where a run's CPU went."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests._scripts import load_script


@pytest.fixture(scope="module")
def acct() -> ModuleType:
    return load_script("suite_acct")


def record(acct: ModuleType, pid: int, ppid: int, comm: str, utime: int, stime: int = 0, version: int = 3) -> bytes:
    fields = (0, version, 0, 0, 0, 0, pid, ppid, 0, 1.0, utime, stime, 0, 0, 0, 0, 0, 0, comm.encode())
    return bytes(acct.RECORD.pack(*fields))


def test_the_record_is_the_kernels_64_bytes_and_comp_t_decodes(acct: ModuleType) -> None:
    assert acct.RECORD.size == 64  # sizeof(struct acct_v3)
    assert acct.comp_t(300) == 300
    assert acct.comp_t((1 << 13) | 5) == 40  # mantissa 5, exponent 1: 5 * 8
    data = record(acct, 10, 1, "python", 300, 20) + record(acct, 11, 10, "slurmstepd", 1)
    procs = acct.parse(data)
    assert [(p.pid, p.ppid, p.comm, p.cpu) for p in procs] == [(10, 1, "python", 3.2), (11, 10, "slurmstepd", 0.01)]


def test_a_file_of_another_format_is_refused(acct: ModuleType) -> None:
    with pytest.raises(ValueError, match="format 2, not v3"):
        acct.parse(record(acct, 10, 1, "python", 1, version=2))


def test_kinds_follow_the_parents_the_sampler_saw(acct: ModuleType) -> None:
    Proc = acct.Proc
    procs = [
        Proc(1, 0, "slurmd", 0.1),
        Proc(2, 1, "slurmstepd", 0.1, parent=1),
        # reparented to init when its step ended: the sampled parent still says where it ran
        Proc(3, 1, "python", 3.0, cmd="python .venv/bin/distinit env --check", parent=2),
        Proc(4, 0, "python", 3.0, cmd="python -B -c from multiprocessing.forkserver import main; main(1)"),
        Proc(5, 4, "python", 0.5, cmd="python -B -c from multiprocessing.forkserver import main; main(1)", parent=4),
        Proc(6, 0, "python", 40.0, cmd="python -u -c import sys;exec(eval(sys.stdin.readline()))"),
        Proc(7, 6, "python", 3.1, cmd="python tests/integration/init/_worker.py {}", parent=6),
        Proc(8, 6, "mpirun", 0.2, cmd="mpirun -np 2 python x.py", parent=6),
    ]
    summary = acct.summarize(procs)
    assert summary["processes"] == 8 and summary["cpu_s"] == pytest.approx(50.0)
    kinds = {k: v["cpu"] for k, v in summary["by_kind"].items()}
    assert kinds == {
        "xdist worker": 40.0,
        "python": 3.1,
        "under a Slurm daemon (srun tasks)": 3.0,
        "multiprocessing fork server": 3.0,
        "run_distributed rank (forkserver child)": 0.5,
        "mpirun": 0.2,
        "slurm daemon": 0.2,
    }
    heavy = summary["interpreters"]
    assert heavy["count"] == 4 and heavy["median_cpu_s"] == 3.1
    assert heavy["by_what_ran"]["_worker.py"] == {"cpu": 3.1, "processes": 1}
    assert heavy["by_what_ran"]["distinit env (under a Slurm daemon (srun tasks))"] == {"cpu": 3.0, "processes": 1}
