"""``DistEnv`` still names its public module, in reprs and pickles (issue 27 builds it once, at import).

The schema's completeness right after import and what ``import distinit.env`` imports are asserted in a fresh
interpreter, in ``tests/integration/env/test_model_build_process.py``.
"""

from __future__ import annotations

import pickle

from distinit.env import DistEnv, env_from_scheduler

ENVIRON = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_public_module_in_repr_and_pickle() -> None:
    env = env_from_scheduler(ENVIRON)
    assert DistEnv.__module__ == "distinit.env"
    assert pickle.loads(pickle.dumps(env)) == env
    assert b"distinit.env._model" not in pickle.dumps(env)
    assert DistEnv.model_validate(env.model_dump()) == env
    assert isinstance(env, DistEnv)
