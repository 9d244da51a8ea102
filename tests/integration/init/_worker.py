"""One rank of a fault test: run ``init_with_retry`` and write the outcome as JSON.

Usage: ``python _worker.py SPEC_JSON OUT_PATH``. SPEC keys: ``kwargs`` (for init_with_retry; ``backoff``
as a dict), ``start_after`` (seconds; the late start IS the scenario), ``mode`` (``normal``,
``die_in_init``: exit in place of init_process_group, simulating a crash after joining),
``after_file`` (wait for this file, a peer's "calling now" mark, before ``start_after``),
``hold`` (seconds to keep the group alive after success), ``call_again`` (after a failure, call
``init_with_retry`` once more in the same process and record the outcome as ``again``).
Mode ``raise_in_join``: a ValueError raised in the join after 1 s of waiting (the rank joined, then failed).
``linger`` (seconds): after a ValueError or KeyboardInterrupt (Ctrl-C), record it and keep the process
alive that long (a caller that caught it), instead of dying.
Modes ``interrupted`` (Ctrl-C during the wait, then a proper init; needs ``peer_started``) and
``threads`` (``call``: ``setup`` or ``init`` from two threads at once) are described at their functions.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main() -> None:
    # The tests send SIGINT as a terminal's Ctrl-C would. A process started from a non-interactive shell's
    # background job (`make test &`, nohup, some CI runners) inherits SIGINT ignored (POSIX), and Python then
    # installs no KeyboardInterrupt handler: the rank would never see the Ctrl-C under test (the cause of the
    # clean-clone failures of the two Ctrl-C tests, issue 34). A Python program run from a terminal has this one.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    spec = json.loads(sys.argv[1])
    out = sys.argv[2]
    logging.basicConfig(level=logging.INFO, format="[%(process)d] %(name)s %(levelname)s %(message)s")
    import torch.distributed as dist

    import distinit
    import distinit.init._setup  # the calls' work, else imported by the first call (issue 35)
    from distinit.init import Backoff, init_with_retry

    if spec.get("after_file"):  # start late relative to a peer's call, not to our own (slow) imports
        end = time.monotonic() + 120
        while not os.path.exists(spec["after_file"]) and time.monotonic() < end:
            time.sleep(0.02)
    time.sleep(float(spec.get("start_after", 0)))  # the late start IS the scenario

    if spec.get("mode") == "die_in_init":

        def die(*args: object, **kwargs: object) -> None:
            # Die only once a peer is inside init_process_group (its bootstrap keys under our ".../pg"
            # prefix appear), so the peer's failure is an init failure, not a lost store during the join.
            store = kwargs.get("store")
            base = getattr(store, "underlying_store", None)
            end = time.monotonic() + 30
            while base is not None and time.monotonic() < end:
                if any("/pg/" in key for key in base.list_keys()):
                    break
                time.sleep(0.02)
            os._exit(3)

        dist.init_process_group = die  # type: ignore[assignment]
    if spec.get("mode") == "die_in_join":
        from distinit.init import _join

        def die_waiting(self: object, generation: int, timeout: float, **kwargs: object) -> None:
            os._exit(4)

        _join.JoinProtocol.wait = die_waiting  # type: ignore[method-assign]
    if spec.get("mode") == "raise_in_join":
        from distinit.init import _join

        def raise_waiting(self: object, generation: int, timeout: float, **kwargs: object) -> None:
            time.sleep(1.0)  # joined and beating meanwhile
            raise ValueError("boom in the join")

        _join.JoinProtocol.wait = raise_waiting  # type: ignore[method-assign]
    if spec.get("hold_gil_after"):  # a thread that holds the GIL for hold_gil_s once the file appears

        def hold_gil() -> None:
            while not os.path.exists(spec["hold_gil_after"]):
                time.sleep(0.02)
            sys.setswitchinterval(60.0)  # no other thread runs until this one blocks or ends
            end = time.monotonic() + float(spec["hold_gil_s"])
            while time.monotonic() < end:
                pass
            sys.setswitchinterval(0.005)

        threading.Thread(target=hold_gil, daemon=True).start()
    kwargs = dict(spec.get("kwargs", {}))
    if "backoff" in kwargs:
        kwargs["backoff"] = Backoff(**kwargs["backoff"])
    kwargs.setdefault("backend", "gloo")
    events: list[dict[str, object]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            payload = getattr(record, "distinit", None)
            if isinstance(payload, dict):
                events.append(payload)

    logging.getLogger("distinit").addHandler(Capture())
    with open(out + ".started", "w"):
        pass
    started = time.monotonic()
    result: dict[str, object] = {"pid": os.getpid(), "events": events}
    try:
        if spec.get("mode") == "setup":
            result.update(setup_sequence(kwargs))
        elif spec.get("mode") == "setup_world":
            result.update(setup_world(kwargs))
        elif spec.get("mode") == "interrupted":
            result.update(interrupted_sequence(kwargs, out=out, peer_started=spec["peer_started"]))
        elif spec.get("mode") == "threads":
            result.update(threads_sequence(kwargs, call=spec["call"]))
        else:
            report = init_with_retry(**kwargs)
            result.update(ok=True, report=json.loads(report.model_dump_json()))
        time.sleep(float(spec.get("hold", 0)))
    except distinit.DistinitError as exc:
        result.update(
            ok=False,
            error=type(exc).__name__,
            message=str(exc),
            ranks=list(getattr(exc, "ranks", ())),
            claimants=list(getattr(exc, "claimants", ())),
        )
    except (ValueError, KeyboardInterrupt) as exc:
        if not spec.get("linger"):
            raise
        result.update(ok=False, error=type(exc).__name__, message=str(exc))
        Path(out + ".caught").touch()
        time.sleep(float(spec["linger"]))  # a caller that caught it and lives on
    result["elapsed"] = time.monotonic() - started
    if spec.get("call_again") and not result.get("ok"):  # a second call in the same process, at once
        try:
            init_with_retry(**kwargs)
            result["again"] = "ok"
        except distinit.DistinitError as exc:
            result["again"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    result["t_end"] = time.time()  # wall clock, for bounds measured from the launch
    with open(out + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(out + ".tmp", out)
    if dist.is_initialized():
        dist.destroy_process_group()


def setup_sequence(kwargs: dict[str, object]) -> dict[str, object]:
    """setup() twice (idempotent), init_with_retry on the live group (compatible / not), teardown twice,
    then a fresh setup() on the same port (re-init after destroy)."""
    import torch.distributed as dist

    from distinit import DistinitError
    from distinit.init import init_with_retry, setup, teardown

    kwargs = {k: v for k, v in kwargs.items() if k != "backend"}
    first = setup("gloo", **kwargs)  # type: ignore[arg-type]
    second = setup("gloo", **kwargs)  # type: ignore[arg-type]
    again = init_with_retry("gloo")
    try:
        init_with_retry("mpi")
        incompatible = "no error"
    except DistinitError as exc:
        incompatible = type(exc).__name__
    teardown()
    teardown()
    torn_down = not dist.is_initialized()
    third = setup("gloo", **kwargs)  # type: ignore[arg-type]
    sizes = dist.get_world_size()
    teardown()
    return {
        "ok": True,
        "same": first is second,
        "already": again.already_initialized,
        "incompatible": incompatible,
        "torn_down": torn_down,
        "reformed": third.report.attempts[-1].phase == "done" and sizes == third.env.world_size,
        "device": first.device,
        "exported_rank": os.environ.get("RANK"),
    }


def setup_world(kwargs: dict[str, object]) -> dict[str, object]:
    """setup() once: the world it verified and what it exported."""
    from distinit.init import setup

    kwargs = {k: v for k, v in kwargs.items() if k != "backend"}
    env = setup("gloo", **kwargs).env  # type: ignore[arg-type]
    exported = {name: os.environ.get(name) for name in ("NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK")}
    return {
        "ok": True,
        "world": {k: getattr(env, k) for k in ("rank", "local_rank", "local_world_size", "node_rank", "num_nodes")},
        "sources": {k: list(v) for k, v in env.sources.items()},
        "notes": list(env.notes),
        "exported": exported,
    }


def interrupted_sequence(kwargs: dict[str, Any], *, out: str, peer_started: str) -> dict[str, object]:
    """init_with_retry until SIGINT (sent by the test) interrupts it; then, with the peer started, watch that
    no group forms behind our back, and call init_with_retry again: it must form the world with the peer."""
    import socket

    import torch.distributed as dist

    from distinit.init import init_with_retry

    try:
        init_with_retry(**kwargs)
        return {"ok": False, "error": "not interrupted"}
    except KeyboardInterrupt:
        interrupted_at = time.time()
    port = int(os.environ["MASTER_PORT"])
    closed_after = None
    while closed_after is None and time.time() - interrupted_at < 10:
        try:  # the abandoned call's store must go away: nobody may join it any more
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            time.sleep(0.05)
        except ConnectionRefusedError:
            closed_after = time.time() - interrupted_at
    Path(out + ".interrupted").touch()
    end = time.monotonic() + 60
    while not os.path.exists(peer_started) and time.monotonic() < end:
        time.sleep(0.02)
    formed_behind = False
    watch_end = time.monotonic() + 4.0  # the peer is up and calling: no group may appear without our call
    while time.monotonic() < watch_end:
        formed_behind = formed_behind or dist.is_initialized()
        time.sleep(0.01)
    report = init_with_retry(**kwargs)
    return {
        "ok": True,
        "interrupted_at": interrupted_at,
        "store_closed_after": closed_after,
        "formed_behind": formed_behind,
        "report": json.loads(report.model_dump_json()),
    }


def threads_sequence(kwargs: dict[str, Any], *, call: str) -> dict[str, object]:
    """setup() (``call="setup"``) or init_with_retry() (``call="init"``) from two threads at the same instant."""
    import threading

    from distinit.init import init_with_retry, setup

    barrier = threading.Barrier(2)
    outcomes: list[dict[str, object]] = [{}, {}]
    results: list[object] = [None, None]

    def one(index: int) -> None:
        barrier.wait(10)
        started = time.monotonic()
        try:
            if call == "setup":
                results[index] = setup(**kwargs)
            else:
                results[index] = init_with_retry(**kwargs)
            outcomes[index] = {"ok": True}
        except Exception as exc:
            outcomes[index] = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        outcomes[index]["elapsed"] = time.monotonic() - started

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return {"ok": all(o.get("ok") for o in outcomes), "threads": outcomes, "same": results[0] is results[1]}


if __name__ == "__main__":
    main()
