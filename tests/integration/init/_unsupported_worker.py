"""One rank for test_init_unsupported.py: ``setup()`` with torch's TCPStore patched to fail as an old torch does.

argv: mode (``unsupported``: hosting raises TypeError; ``libuv``: the store server refuses a listening fd as
torch 2.4's libuv server does), rank, world size, port, output JSON path.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time


def main() -> None:
    mode, rank, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("distinit").addHandler(Capture())
    logging.getLogger("distinit").setLevel(logging.INFO)
    import torch.distributed as dist

    import distinit
    from distinit.init import _store

    real = _store.TCPStore  # type: ignore[attr-defined]
    calls: list[dict[str, object]] = []

    class Patched(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            if kwargs.get("is_master"):
                calls.append({k: v for k, v in kwargs.items() if k in ("use_libuv", "master_listen_fd")})
                if mode == "unsupported":
                    raise TypeError("__init__(): incompatible constructor arguments (an older torch)")
                if kwargs.get("master_listen_fd") is not None and kwargs.get("use_libuv", True):
                    raise NotImplementedError(
                        "The libuv TCPStore backend does not support initialization with an listen fd. Please "
                        'switch to the legacy TCPStore by setting environment variable USE_LIBUV to "0".'
                    )
            super().__init__(*args, **kwargs)

    _store.TCPStore = Patched  # type: ignore[attr-defined]
    started = time.monotonic()
    result: dict[str, object] = {}
    try:
        distinit.setup(backend="gloo", deadline=120, attempt_timeout=20)
        import torch

        tensor = torch.ones(1) * (rank + 1)
        dist.all_reduce(tensor)
        result.update(ok=True, sum=float(tensor.item()))
    except distinit.DistinitError as exc:
        result.update(ok=False, error=type(exc).__name__, message=str(exc))
    result.update(elapsed=time.monotonic() - started, calls=calls, records=records)
    with open(out + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(out + ".tmp", out)
    distinit.teardown()


if __name__ == "__main__":
    main()
