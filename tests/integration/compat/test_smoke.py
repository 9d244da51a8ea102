"""The compat smoke test (issue 35): each feature once, in real processes, on whichever torch is installed.

``make test-compat`` runs this file on the oldest supported torch and the newest on the index
(docs/compat.md); the full suite runs it on the pinned torch. Each test is the smallest real run of one
feature: ``setup()`` on 4 ranks (rank 0 hosting the store), the broadcasts, the watchdog killing a hung
worker, ``distinit doctor`` under torchrun, the ``distinit`` torchrun backend, and the FileTimer drop-in.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from doctor_launch import DOCTOR, clean_environ
from init_launch import Launcher
from rdzv_agents import TORCHRUN, Agent, Agents
from wd_helpers import Workers, expired_for, read_json_line, wait_for

from distinit.testing import run_distributed
from distinit.watchdog import WatchdogServer
from distinit.watchdog.elastic import FileTimerServer

FT_WORKER = str(Path(__file__).resolve().parents[1] / "watchdog" / "ft_worker.py")
#: ``python -m distinit.rendezvous``: torchrun with the ``distinit`` backend registered (docs/torchrun.md).
DISTINIT_TORCHRUN = (sys.executable, "-m", "distinit.rendezvous")

pytestmark = pytest.mark.timeout(180)


def _torch_loads_entry_points() -> bool:
    """Whether this torch registers ``torchrun.handlers`` entry points (so plain ``torchrun`` finds distinit)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    return "distinit" in getattr(rendezvous_handler_registry, "_registry", {})


def _torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_setup_forms_a_world_of_four_with_rank_0_hosting_the_store(launcher: Launcher, port: int) -> None:
    ranks = [launcher.start(r, 4, port, kwargs={"deadline": 60}, mode="setup_world") for r in range(4)]
    results = [r.result(90) for r in ranks]
    for rank, result in enumerate(results):
        assert result["ok"], result
        assert result["world"]["rank"] == rank
    # A torch whose libuv store server takes no listening socket (2.4) is served by the legacy one, said once.
    hosted = results[0]["log"]
    assert ("use_libuv=False" in hosted) == (_torch_release() < (2, 5)), hosted[-3000:]


def _broadcasts_after_setup() -> dict[str, object]:
    import torch.distributed as dist

    import distinit
    from distinit.broadcast import broadcast_state_dict, broadcast_tensor

    report = distinit.setup("gloo", deadline=60)
    rank = dist.get_rank()
    tensor = broadcast_tensor(torch.arange(6.0) if rank == 0 else None, src=0)
    source = {"w": torch.full((3, 4), 7.0), "b": torch.arange(5, dtype=torch.int64), "s": torch.tensor(1.5)}
    network = broadcast_state_dict(source if rank == 0 else None, src=0)
    shm = broadcast_state_dict(source if rank == 0 else None, src=0, via="shm")
    same = all(torch.equal(network[k], v) and torch.equal(shm[k], v) for k, v in source.items())
    return {"world": report.env.world_size, "tensor": tensor.tolist(), "same": same, "keys": list(network)}


def test_broadcast_tensor_and_state_dict_after_setup_on_four_ranks(port: int) -> None:
    # A plain env:// world on a port of its own (rank 0 hosts), not the harness's agent store: distinit's env
    # honours TORCHELASTIC_USE_AGENT_STORE only under torchrun, and torch < 2.5 does not tolerate the bind
    # failure there as newer torches do (docs/compat.md).
    plain = {"MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    results = run_distributed(_broadcasts_after_setup, world_size=4, init=False, timeout=120, env=plain)
    assert (
        results == [{"world": 4, "tensor": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "same": True, "keys": ["w", "b", "s"]}] * 4
    )


def test_the_watchdog_kills_a_hung_worker_and_nothing_else(tmp_path: Path, workers: Workers) -> None:
    events = tmp_path / "events.jsonl"
    with WatchdogServer(str(tmp_path / "wd"), grace=0.0, events=str(events)) as server:
        hung = workers.spawn(server.env(), "sleep", "0.5")
        assert read_json_line(hung, 60)["registered"] is True
        assert hung.wait(30) in (-signal.SIGTERM, -signal.SIGKILL)
        event = wait_for(expired_for(events, hung.pid), 10, "the expired event")
        assert event["outcome"] == "killed" and 'wd_worker.py", line' in event["stack"]
        assert server.running


@pytest.mark.timeout(240)
def test_the_doctor_under_torchrun_four_reaches_ok(tmp_path: Path) -> None:
    # torch 2.4.1 once hung here after "verdict: ok" (a gloo group destroyed under the GIL: doctor/_exchange.py).
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node=4", "--no-python", *DOCTOR, "--timeout", "60"]
    log = tmp_path / "doctor.log"
    with log.open("wb") as out:  # its own session: a hung run is killed with its workers (Agent.wait)
        proc = subprocess.Popen(
            command, env=clean_environ(), stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True
        )
    rc, text, _elapsed = Agent("doctor", proc, log, time.monotonic()).wait(200)
    assert rc == 0 and "verdict: ok" in text, text[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", ["torchrun", "python -m distinit.rendezvous"])
def test_the_distinit_torchrun_backend_forms_a_world_of_two_agents(agents: Agents, port: int, command: str) -> None:
    launcher = (str(TORCHRUN),) if command == "torchrun" else DISTINIT_TORCHRUN
    registered = command != "torchrun" or _torch_loads_entry_points()
    started = [agents.start(f"a{i}", f"127.0.0.1:{port}", torchrun=launcher) for i in range(2)]
    for agent in started:
        rc, text, elapsed = agent.wait(200)
        if registered:
            assert rc == 0, text[-3000:]
            assert "world=2 sum=2 restart=0" in text, text[-3000:]
        else:  # torch < 2.5 loads no torchrun.handlers entry point: torch says so at once
            assert rc != 0 and "The rendezvous backend 'distinit' is not registered" in text, text[-3000:]
            assert elapsed < 60


def test_a_hung_worker_of_the_file_timer_drop_in_is_killed(tmp_path: Path, workers: Workers) -> None:
    fifo = str(tmp_path / "timer.fifo")
    server = FileTimerServer(fifo, "job", max_interval=0.1)
    server.start()
    try:
        hung = workers.track(
            subprocess.Popen([sys.executable, FT_WORKER, "distinit", fifo, "0.5"], stdout=subprocess.PIPE, text=True)
        )
        ready = read_json_line(hung, 60)
        assert ready["ready"] is True
        started = time.time()
        assert hung.wait(30) == -signal.SIGKILL
        assert time.time() - started < 20
    finally:
        server.stop()
