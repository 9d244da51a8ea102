"""``DistEnv`` is built once, at import, and still names its public module (issue 27's import cost).

What is imported is asserted here, never how long it takes: timings live in ``benchmarks/bench_import.py``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

from distinit.env import DistEnv, env_from_scheduler

ENVIRON = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_schema_is_complete_right_after_import() -> None:
    # A fresh interpreter: in this one an earlier validation may already have rebuilt the schema. An
    # incomplete schema at import means every model naming DistEnv rebuilds it, and so does its first use.
    done = _fresh("import sys; from distinit.env import DistEnv; sys.exit(0 if DistEnv.__pydantic_complete__ else 3)")
    assert done.returncode == 0, done.stderr


def test_env_imports_neither_torch_nor_tenacity() -> None:
    code = "import sys, distinit.env; print(sorted({'torch', 'tenacity'} & set(sys.modules)))"
    done = _fresh(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_public_module_in_repr_and_pickle() -> None:
    env = env_from_scheduler(ENVIRON)
    assert DistEnv.__module__ == "distinit.env"
    assert pickle.loads(pickle.dumps(env)) == env
    assert b"distinit.env._model" not in pickle.dumps(env)
    assert DistEnv.model_validate(env.model_dump()) == env
    assert isinstance(env, DistEnv)
