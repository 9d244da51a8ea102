"""The deterministic MASTER_PORT: same on every rank, distinct per step, outside the ephemeral range."""

from __future__ import annotations

from distinit import env_from_scheduler
from distinit.env._draft import PORT_RANGE, hashed_port
from tests.unit.env.cases import srun


def test_range_and_determinism() -> None:
    ports = {hashed_port(str(job), "0") for job in range(5000)}
    assert all(PORT_RANGE[0] <= port <= PORT_RANGE[1] < 32768 for port in ports)
    assert hashed_port("123", "0") == hashed_port("123", "0")
    assert len(ports) > 4000, "job ids must spread over the range"


def test_same_on_every_rank_different_per_step() -> None:
    layout = {"ntasks": 4, "tasks_per_node": "2(x2)", "nodelist": "n[1-2]", "nnodes": 2}
    rank0 = env_from_scheduler(srun(procid=0, localid=0, nodeid=0, gtids="0,1", **layout))
    rank3 = env_from_scheduler(srun(procid=3, localid=1, nodeid=1, gtids="2,3", **layout))
    other_step = env_from_scheduler(srun(step="1", procid=0, localid=0, nodeid=0, gtids="0,1", **layout))
    assert rank0.master_port == rank3.master_port is not None
    assert other_step.master_port != rank0.master_port
    assert rank0.sources["master_port"] == ("rule: hash(SLURM_JOB_ID, SLURM_STEP_ID)",)


def test_lightning_aliasing_jobs_do_not_collide() -> None:
    # 15000 + last 4 digits gives jobs 11234 and 21234 the same port; the hash does not.
    assert hashed_port("11234", "0") != hashed_port("21234", "0")
