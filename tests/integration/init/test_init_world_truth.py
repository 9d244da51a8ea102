"""setup() derives node identity from the world itself: ranks on fake hosts (UTS namespaces, so each
"host" has its own hostname) in real processes, with the environment's node values missing or wrong."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from init_launch import Launcher

KWARGS = {"deadline": 40, "attempt_timeout": 15}


def _uts_available() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    probe = subprocess.run(["unshare", "--uts", "hostname", "probe"], capture_output=True, timeout=10, check=False)
    return None if probe.returncode == 0 else f"cannot create a UTS namespace: {probe.stderr.decode().strip()}"


pytestmark = pytest.mark.skipif(_uts_available() is not None, reason=str(_uts_available()))


def _on_host(name: str) -> list[str]:
    """A command prefix that runs the rank with hostname ``name`` (its own UTS namespace)."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh"]


def _start(
    launcher: Launcher, port: int, placement: list[str], env: dict[str, str], unset: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """One rank per entry of ``placement`` (its host's name), local ranks in order on each host."""
    handles = [
        launcher.start(
            rank,
            len(placement),
            port,
            kwargs=KWARGS,
            mode="setup_world",
            env={**env, "LOCAL_RANK": str(placement[:rank].count(host))},
            unset=unset,
            prefix=_on_host(host),
        )
        for rank, host in enumerate(placement)
    ]
    return [h.result(90) for h in handles]


@pytest.mark.timeout(120)
def test_round_robin_placement_without_node_rank_gets_the_truth(launcher: Launcher, port: int) -> None:
    # What mpirun --map-by node gives: ranks 0,2 on hosta and 1,3 on hostb, no NODE_RANK anywhere.
    results = _start(launcher, port, ["hosta", "hostb", "hosta", "hostb"], {}, unset=("LOCAL_WORLD_SIZE",))
    for rank, res in enumerate(results):
        assert res["ok"], res
        world = res["world"]
        assert (world["node_rank"], world["num_nodes"], world["local_world_size"]) == (rank % 2, 2, 2), res
        assert res["sources"]["node_rank"] == ["world: host identity"]
        assert res["exported"]["NODE_RANK"] == res["exported"]["GROUP_RANK"] == str(rank % 2)
        assert res["exported"]["LOCAL_WORLD_SIZE"] == "2"


@pytest.mark.timeout(120)
def test_a_wrong_node_rank_on_one_fake_host_fails_the_same_on_every_rank(launcher: Launcher, port: int) -> None:
    # Block placement, NODE_RANK exported by hand, wrongly on hostb (0 instead of 1): Lightning's bug.
    results = _start(launcher, port, ["hosta", "hosta", "hostb", "hostb"], {"NODE_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    messages = {res["message"].split("\n")[0] for res in results}
    assert all(res["error"] == "ConflictingEnvError" for res in results), results
    assert len(messages) == 1, messages  # one verdict, the same words on every rank
    (message,) = messages
    assert "2 hosts claim node rank 0: hosta, hostb" in message
    assert "hosta = ranks 0,1" in results[0]["message"] and "hostb = ranks 2,3" in results[0]["message"]
