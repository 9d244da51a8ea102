"""The `distinit env` command, run in-process on controlled environments (no process group)."""

from __future__ import annotations

import json

import pytest

from distinit import cli

OMPI = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI", "MPI_", "TORCHELASTIC_", "SM_", "PALS_", "JSM_", "HOROVOD_", "MV2_")
TORCH_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CLUSTER_SPEC",
    "PET_NPROC_PER_NODE",
    "NPROC_PER_NODE",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in TORCH_NAMES:
            monkeypatch.delenv(name)
    return monkeypatch


def test_json(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in OMPI.items():
        clean_env.setenv(key, value)
    assert cli.main(["env", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rank"] == 1 and document["launcher"] == "openmpi"
    assert document["sources"]["rank"] == ["OMPI_COMM_WORLD_RANK"]


def test_explain_names_sources_and_notes(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in OMPI.items():
        clean_env.setenv(key, value)
    assert cli.main(["env", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "rank 1 of 2, launcher openmpi" in out
    assert "OMPI_COMM_WORLD_LOCAL_SIZE" in out
    assert "rule: whole world on this node" in out
    assert "MASTER_PORT is unknown" in out  # the note


def test_export_shell_quotes(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in OMPI.items():
        clean_env.setenv(key, value)
    assert cli.main(["env", "--export-shell"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "export RANK=1" in lines and "export MASTER_ADDR=127.0.0.1" in lines


def test_bad_environment_exits_2(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in OMPI.items():
        clean_env.setenv(key, value)
    clean_env.setenv("RANK", "0")
    assert cli.main(["env"]) == 2
    err = capsys.readouterr().err
    assert "ConflictingEnvError" in err and "OMPI_COMM_WORLD_RANK" in err and "fix:" in err


def test_no_strict(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("SLURM_JOB_ID", "5")
    clean_env.setenv("SLURM_NTASKS", "4")
    assert cli.main(["env"]) == 2
    assert "NotLaunchedError" in capsys.readouterr().err
    assert cli.main(["env", "--no-strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 1


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-1", "0", "abc"])
def test_check_timeout_must_be_finite_positive(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # `--check-timeout inf` used to reach timedelta(seconds=inf): an OverflowError traceback, exit 1.
    with pytest.raises(SystemExit) as exited:
        cli.main(["env", "--no-strict", "--check", f"--check-timeout={value}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--check-timeout" in err
    assert "Traceback" not in err
