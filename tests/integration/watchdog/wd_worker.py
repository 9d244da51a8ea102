"""A worker process for the watchdog tests: `python wd_worker.py MODE [ARG]`.

Each MODE is a function below. It registers with the server named by DISTINIT_WATCHDOG, prints one JSON
line ({"ready": ..., "pid": ..., "thread": ..., "registered": ...}) once its region is armed, then hangs (or
misbehaves) as MODE says.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from distinit.errors import WatchdogError
from distinit.watchdog import WatchdogClient, configure, expires


def say(**facts: object) -> None:
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()


def sleep(client: WatchdogClient, after: float, ident: int) -> None:
    with client.expires(after, scope="sleep-hang"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, reason=client.reason)
        time.sleep(600)  # hang:sleep


def gil(client: WatchdogClient, after: float, ident: int) -> None:
    with client.expires(after, scope="gil-hang"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        sum(range(10**14))  # one C call holding the GIL: Python signal handlers cannot run


def torch_api(client: WatchdogClient, after: float, ident: int) -> None:
    configure(client)
    with expires(after=after):  # torch.distributed.elastic.timer's call shape, default scope
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        time.sleep(600)  # hang:torch_api


def nested(client: WatchdogClient, after: float, ident: int) -> None:
    # Same scope twice: the inner region's exit must not disarm the outer one (torch's key clobbers it).
    with client.expires(after, scope="step"):
        with client.expires(60, scope="step"):
            pass
        with client.expires(60, scope="step"):
            say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        time.sleep(600)  # hang:nested


def threads(client: WatchdogClient, after: float, ident: int) -> None:
    hang = threading.Event()
    done = threading.Event()

    def region(hangs: bool) -> None:
        for _ in range(2000):
            with client.expires(after if hangs else 60):  # every thread on the same default-scope line
                if hangs and not hang.is_set():
                    hang.set()
                    done.wait(600)

    fast = [threading.Thread(target=region, args=(False,)) for _ in range(3)]
    slow = threading.Thread(target=region, args=(True,))
    slow.start()
    hang.wait(30)
    for t in fast:
        t.start()
    for t in fast:
        t.join()
    say(ready=True, pid=os.getpid(), thread=slow.ident, registered=client.registered)
    slow.join()


def exit_armed(client: WatchdogClient, after: float, ident: int) -> None:
    with client.expires(60, scope="exits"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        sys.stdin.readline()  # the test tells us when to go
        os._exit(0)


def sigstop(client: WatchdogClient, after: float, ident: int) -> None:
    with client.expires(after, scope="stopped"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        os.kill(os.getpid(), signal.SIGSTOP)  # stops here
        time.sleep(600)  # hang:sigstop


def ignore_term(client: WatchdogClient, after: float, ident: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with client.expires(after, scope="ignores-term"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        time.sleep(600)  # hang:ignore_term


def heartbeat(client: WatchdogClient, after: float, ident: int) -> None:
    hb = client.heartbeat(after)
    say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
    for _ in range(10):  # alive for 10 beats spaced well inside the timeout
        time.sleep(after / 5)
        hb.beat()
    say(stopped_beating=True)
    time.sleep(600)  # hang:heartbeat


def load(client: WatchdogClient, after: float, ident: int) -> None:
    arms = int(sys.argv[3])
    errors = 0
    for _ in range(arms):
        try:
            with client.expires(60, scope="load"):
                pass
        except Exception:
            errors += 1
    with client.expires(after, scope="final"):
        say(
            ready=True,
            pid=os.getpid(),
            thread=ident,
            registered=client.registered,
            errors=errors,
            overflows=client.overflows,
        )
        time.sleep(600)  # hang:load


def completes(client: WatchdogClient, after: float, ident: int) -> None:
    for _ in range(100):
        with client.expires(after, scope="quick"):
            pass
    say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, reason=client.reason)
    with client.expires(after, scope="guarded"):
        time.sleep(after * 3)
    say(completed=True)


def gloo(client: WatchdogClient, after: float, ident: int) -> None:
    import torch.distributed as dist

    rank = int(sys.argv[3])
    store = dist.FileStore(sys.argv[4], 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    if rank == 0:
        with client.expires(after, scope="barrier"):
            say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
            dist.barrier()  # hang:gloo (rank 1 never joins)
    else:
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
        time.sleep(600)  # hang:gloo-peer


def ddp(client: WatchdogClient, after: float, ident: int) -> None:
    # A real DDP step on CPU: RANK hung_rank hangs in its own code inside the guarded step, after its
    # forward; the others block in backward(), in DDP's gloo all-reduce, inside the same guarded region.
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world, hung_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[4], world), rank=rank, world_size=world)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))

    def step(hang: bool) -> None:
        loss = model(torch.randn(8, 16)).square().sum()
        if hang:
            time.sleep(600)  # hang:ddp-culprit (its own code: a stuck data pipeline, a deadlock...)
        loss.backward()  # the victims wait here for the culprit's gradients

    step(hang=False)  # one healthy step: every rank is in sync when the guarded one starts
    with client.expires(after, scope="train_step"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, rank=rank)
        step(hang=rank == hung_rank)
    say(completed=True)


def subgroup(client: WatchdogClient, after: float, ident: int) -> None:
    # RANK hung_rank hangs in its own code inside its region; RANKs 0 and 1 wait in a barrier of the group
    # {0, 1, 3} inside theirs, for RANK 3, which idles outside any region. The culprit's death does not
    # end their wait (it is not in their group): they stay blocked, victims to be killed after the hold.
    import torch.distributed as dist

    rank, world, hung_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(sys.argv[3])
    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[4], world), rank=rank, world_size=world)
    waiters = dist.new_group([0, 1, 3])  # every rank takes part in creating it
    if rank == 3:
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, rank=rank)
        time.sleep(600)  # hang:subgroup-absent, unguarded
    with client.expires(after, scope="step"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, rank=rank)
        if rank == hung_rank:
            time.sleep(600)  # hang:subgroup-culprit
        dist.barrier(group=waiters)  # hang:subgroup-victim


def nccl_allreduce_wait(deadline: float) -> None:
    # User code that only *looks* like a collective by its name: it spins in Python (issue 23 item 10).
    while time.monotonic() < deadline:
        pass  # hang:named-like-nccl


def misnamed(client: WatchdogClient, after: float, ident: int) -> None:
    # Two gloo ranks (argv[3] is this rank; the one argv[4] names the FileStore): rank 0 spins in its own
    # ``nccl_allreduce_wait`` inside its region, rank 1 waits for it in a real barrier inside its own.
    import torch.distributed as dist

    rank = int(sys.argv[3])
    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[4], 2), rank=rank, world_size=2)
    with client.expires(after, scope="step"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, rank=rank)
        if rank == 0:
            nccl_allreduce_wait(time.monotonic() + 600)
        dist.barrier()  # hang:misnamed-victim


def on_cue(client: WatchdogClient, after: float, ident: int) -> None:
    # Arms when the test writes a line: regions of several workers start together. With a third argument
    # the region is left after that many seconds (a healthy worker); without, it hangs.
    leave = float(sys.argv[3]) if len(sys.argv) > 3 else None
    say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered)
    sys.stdin.readline()
    with client.expires(after, scope="cued"):
        time.sleep(600 if leave is None else leave)  # hang:on_cue
    say(left=True)
    time.sleep(600)  # unguarded from here


def group(client: WatchdogClient, after: float, ident: int) -> None:
    import subprocess

    child = subprocess.Popen(["sleep", "600"])  # e.g. a dataloader worker, in our process group
    with client.expires(after, scope="group"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, child=child.pid)
        time.sleep(600)  # hang:group


def recreate(client: WatchdogClient, after: float, ident: int) -> None:
    try:
        WatchdogClient()  # a second client beside the first: refused, not silently unguarded
    except WatchdogError as exc:
        second = str(exc).splitlines()[0]
    else:
        second = "accepted"
    client.close()
    client = WatchdogClient()  # re-created after close(): must be enforced
    with client.expires(after, scope="recreated"):
        say(ready=True, pid=os.getpid(), thread=ident, registered=client.registered, second=second)
        time.sleep(600)  # hang:recreate


MODES: dict[str, Callable[[WatchdogClient, float, int], None]] = {
    "sleep": sleep,
    "gil": gil,
    "torch_api": torch_api,
    "nested": nested,
    "threads": threads,
    "exit_armed": exit_armed,
    "sigstop": sigstop,
    "ignore_term": ignore_term,
    "heartbeat": heartbeat,
    "load": load,
    "completes": completes,
    "gloo": gloo,
    "ddp": ddp,
    "on_cue": on_cue,
    "misnamed": misnamed,
    "subgroup": subgroup,
    "group": group,
    "recreate": recreate,
}


def main() -> None:
    mode = sys.argv[1]
    after = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}")
    if "WD_CLAIM_RANK" in os.environ:  # an impostor: claims another RANK than the one it was started with
        os.environ["RANK"] = os.environ["WD_CLAIM_RANK"]
    MODES[mode](WatchdogClient(), after, threading.get_ident())


if __name__ == "__main__":
    main()
