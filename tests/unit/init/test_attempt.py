"""init/_attempt.py's pure parts: the attempts' records, and the launcher's facts a call takes from its world.

How the launcher's own count and torchrun's agent store are resolved: tests/unit/env/test_launched.py.
"""

from __future__ import annotations

from distinit.env import DistEnv, env_from_scheduler
from distinit.init._attempt import AttemptLog, Rendezvous
from distinit.init._policy import AttemptFailed, Backoff, Bounds


def test_the_log_keeps_one_record_per_attempt_and_the_last_missing_ranks() -> None:
    log = AttemptLog(rank=1, master="h:1", start=0.0, deadline_at=1e12)
    failure = AttemptFailed("join", "1/2 ranks joined generation 0, missing ranks 1", missing_ranks=(1,))
    log.record(number=1, begun=0.0, phase="join", generation=0, exc=failure)
    log.mark_retried()
    log.record(number=2, begun=0.0, phase="probe", generation=None, exc=AttemptFailed("refused", "nothing"))
    assert [r.retried for r in log.records] == [True, False]
    assert log.last_missing() == (1,)
    assert log.lines()[0].startswith("#1 join") and "(refused)" in log.lines()[1]


def _rendezvous(env: DistEnv, environ: dict[str, str]) -> Rendezvous:
    bounds = Bounds.of(deadline=10.0, attempt_timeout=5.0, pg_timeout=None)
    return Rendezvous(
        env=env, backend="gloo", bounds=bounds, device_id=None, verify=False, environ=environ,
        backoff=Backoff(), call=(1, False), watch_init=False,
    )  # fmt: skip


TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "r1",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "RANK": "0",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_the_attempts_take_the_launchers_facts_from_the_world_not_the_environment() -> None:
    """Resolved from torchrun's variables: its agent hosts the store and it started 2 of the 4 ranks."""
    session = _rendezvous(env_from_scheduler(TORCHRUN), environ={})
    assert (session.agent, session.hosting) == (True, False)
    assert session.launched == (2, "torchrun: LOCAL_WORLD_SIZE=2 x 1 node(s)")
    assert session.namespace == "distinit/r1/0/c1/"


def test_a_world_built_by_hand_says_what_it_says() -> None:
    """The variables around a hand-built world are not read: no agent store unless the world says so."""
    env = DistEnv(rank=0, local_rank=0, world_size=4, launcher="torchrun", master_addr="127.0.0.1", master_port=1)
    session = _rendezvous(env, environ=TORCHRUN)
    assert (session.agent, session.hosting, session.launched) == (False, True, None)
    assert session.namespace == "distinit/job/0/c1/"
    told = DistEnv.model_validate({**env.model_dump(), "agent_store": True, "launched": 2})
    session = _rendezvous(told, environ={})
    assert (session.agent, session.hosting, session.launched) == (True, False, (2, "launched=2"))
