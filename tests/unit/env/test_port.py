"""The MASTER_PORT policy: one valid range, deterministic derived ports outside the ephemeral range."""

from __future__ import annotations

import pytest

from distinit import MalformedEnvError, env_from_scheduler
from distinit._port import DERIVED_PORTS, PORT_ADVICE, PORT_MAX, PORT_MIN, check_port, derived_port
from tests.unit.env.cases import srun


def test_range_and_determinism() -> None:
    ports = {derived_port(str(job), "0") for job in range(5000)}
    assert all(DERIVED_PORTS[0] <= port <= DERIVED_PORTS[1] < 32768 for port in ports)
    assert derived_port("123", "0") == derived_port("123", "0")
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
    assert derived_port("11234", "0") != derived_port("21234", "0")


def test_undecodable_job_id_still_hashes() -> None:
    # os.environ keeps bytes that are not UTF-8 as lone surrogates; str.encode() would raise on them.
    assert DERIVED_PORTS[0] <= derived_port("12\udcff34", "0") <= DERIVED_PORTS[1]


@pytest.mark.parametrize("port", [PORT_MIN, 22, 29500, PORT_MAX])
def test_check_port_accepts_tcp_ports(port: int) -> None:
    check_port(port)


@pytest.mark.parametrize("port", [0, -1, PORT_MAX + 1, 10**40])
def test_check_port_rejects_with_the_one_advice(port: int) -> None:
    with pytest.raises(MalformedEnvError) as caught:
        check_port(port, variable="MASTER_PORT", where=" (rank 3)")
    assert caught.value.variables == ("MASTER_PORT",)
    assert caught.value.fix == PORT_ADVICE
    assert "(rank 3)" in str(caught.value) and "1-65535" in str(caught.value)
    assert len(str(caught.value)) < 600


def test_exported_port_out_of_range_names_the_variable() -> None:
    with pytest.raises(MalformedEnvError, match="MASTER_PORT=70000 is not a TCP port") as caught:
        env_from_scheduler({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"})
    assert caught.value.fix == PORT_ADVICE
