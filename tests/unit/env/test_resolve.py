"""Table tests of env_from_scheduler over named launcher environments (see cases.py)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from distinit import DistEnv, SchedulerEnvError, env_from_scheduler
from distinit.errors import IncompleteEnvError, NotLaunchedError
from tests.unit.env.cases import ALLOC, BAD, GOOD


@pytest.mark.parametrize(("environ", "expected"), GOOD)
def test_resolves(environ: dict[str, str], expected: dict[str, Any]) -> None:
    env = env_from_scheduler(environ)
    assert {key: getattr(env, key) for key in expected} == expected
    # Invariants every resolved world must satisfy.
    assert 0 <= env.rank < env.world_size
    assert env.local_world_size is None or env.local_rank < env.local_world_size <= env.world_size
    assert set(env.sources) >= {"rank", "world_size"}
    exported = env.to_environ()
    assert exported["RANK"] == str(env.rank) and exported["WORLD_SIZE"] == str(env.world_size)


@pytest.mark.parametrize(("environ", "error", "named"), BAD)
def test_rejects(environ: dict[str, str], error: type[SchedulerEnvError], named: tuple[str, ...]) -> None:
    with pytest.raises(error) as caught:
        env_from_scheduler(environ)
    message = str(caught.value)
    assert all(name in message for name in named), message
    assert named[0] in caught.value.variables, f"{named[0]} missing from {caught.value.variables}"
    assert caught.value.fix, "every error must say how to fix it"
    assert isinstance(caught.value, ValueError)


def test_at_least_sixty_environments() -> None:
    assert len(GOOD) + len(BAD) >= 60


def test_pure_function_of_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "OMPI_COMM_WORLD_SIZE", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    env = env_from_scheduler({})  # the mapping, not os.environ
    assert env.world_size == 1
    with pytest.raises(IncompleteEnvError, match="LOCAL_RANK"):  # os.environ is read when no mapping is given
        env_from_scheduler()


def test_reads_os_environ_and_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
    ):
        # setenv first: monkeypatch then restores a name that was absent to absent, so what export() writes
        # below does not leak into later tests (a leaked GROUP_RANK broke `srun` tests run after this one).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name in [n for n in __import__("os").environ if n.startswith(("SLURM_", "OMPI_", "PMI", "SM_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    env = env_from_scheduler()
    import os

    assert "RANK" not in os.environ, "env_from_scheduler() must have no side effects"
    env_from_scheduler(export=True)
    assert os.environ["RANK"] == "1" and os.environ["LOCAL_WORLD_SIZE"] == "2"
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["NODE_RANK"] == "0"
    assert env.to_environ() == {key: os.environ[key] for key in env.to_environ()}


def test_non_strict_turns_not_launched_into_single_process() -> None:
    with pytest.raises(NotLaunchedError):
        env_from_scheduler({**ALLOC, "SLURM_PROCID": "0"})
    env = env_from_scheduler({**ALLOC, "SLURM_PROCID": "0"}, strict=False)
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "none")
    assert any("not launched" in note for note in env.notes)
    assert env.job_id == "4242"


def test_unknown_master_is_left_out_of_environ() -> None:
    env = env_from_scheduler(
        {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        }
    )
    assert env.master_addr is None
    assert "MASTER_ADDR" not in env.to_environ()
    assert any("mpirun -x MASTER_ADDR" in note for note in env.notes)
    assert env.node_rank is None
    assert any("node_rank is unknown" in note and "setup()" in note for note in env.notes), env.notes


def test_sources_name_the_variables() -> None:
    env = env_from_scheduler(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_MCA_orte_num_nodes": "2",
        }
    )
    assert env.sources["rank"] == ("OMPI_COMM_WORLD_RANK",)
    assert env.sources["local_world_size"] == ("OMPI_COMM_WORLD_LOCAL_SIZE",)
    assert env.sources["node_rank"][0].startswith("rule:")


def test_model_is_frozen_and_validates() -> None:
    env = env_from_scheduler({})
    with pytest.raises(Exception):  # noqa: B017,PT011 - pydantic's frozen-instance error
        env.rank = 3  # type: ignore[misc]
    with pytest.raises(ValueError):  # noqa: PT011
        DistEnv.model_validate({**env.model_dump(), "rank": 7})


def test_json_round_trip() -> None:
    env = env_from_scheduler(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        }
    )
    assert DistEnv.model_validate_json(env.model_dump_json()) == env


@pytest.mark.parametrize(("environ", "error", "named"), BAD[:8])
def test_errors_pickle_and_copy(
    environ: dict[str, str], error: type[SchedulerEnvError], named: tuple[str, ...]
) -> None:
    with pytest.raises(error) as caught:
        env_from_scheduler(environ)
    for clone in (pickle.loads(pickle.dumps(caught.value)), copy.copy(caught.value)):
        assert type(clone) is error
        assert str(clone) == str(caught.value)
        assert clone.variables == caught.value.variables
