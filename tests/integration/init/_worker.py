"""One rank of a fault test: run ``init_with_retry`` and write the outcome as JSON.

Usage: ``python _worker.py SPEC_JSON OUT_PATH``. SPEC keys: ``kwargs`` (for init_with_retry; ``backoff``
as a dict), ``start_after`` (seconds; the late start IS the scenario), ``mode`` (``normal``,
``die_in_init``: exit in place of init_process_group, simulating a crash after joining),
``after_file`` (wait for this file, a peer's "calling now" mark, before ``start_after``),
``hold`` (seconds to keep the group alive after success), ``call_again`` (after a failure, call
``init_with_retry`` once more in the same process and record the outcome as ``again``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = sys.argv[2]
    logging.basicConfig(level=logging.INFO, format="[%(process)d] %(name)s %(levelname)s %(message)s")
    import torch.distributed as dist

    import distinit
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

        def die_waiting(self: object, generation: int, timeout: float) -> None:
            os._exit(4)

        _join.JoinProtocol.wait = die_waiting  # type: ignore[method-assign]
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


if __name__ == "__main__":
    main()
