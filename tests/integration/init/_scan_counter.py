"""Run ``_worker.py`` with every TCPStore key read counted, to show which rank scans the join.

Usage (as a launcher prefix): ``python _scan_counter.py PYTHON _worker.py SPEC_JSON OUT_PATH``. Reads are
counted per key kind -- the part after ``g<generation>/`` (``claim/3``, ``order/2``, ``missing``, ``joined``)
-- for ``check``, ``get``, ``multi_get`` (each key) and ``add(key, 0)``, and written to ``OUT_PATH.reads``
as JSON when the process exits.
"""

from __future__ import annotations

import atexit
import json
import re
import runpy
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch.distributed as dist

_JOIN_KEY = re.compile(r"/g\d+/(.+)$")
reads: Counter[str] = Counter()


def _count(keys: list[str] | tuple[str, ...]) -> None:
    for key in keys:
        match = _JOIN_KEY.search(key)
        if match is not None and not match.group(1).startswith("pg"):
            reads[match.group(1)] += 1


def _wrap(name: str) -> None:
    original = getattr(dist.TCPStore, name)

    def counted(self: Any, *args: Any) -> Any:
        if name in ("check", "multi_get"):
            _count(args[0])
        elif name == "get" or (name == "add" and args[1] == 0):
            _count([args[0]])
        return original(self, *args)

    setattr(dist.TCPStore, name, counted)


def main() -> None:
    worker, spec, out = sys.argv[2], sys.argv[3], sys.argv[4]
    for name in ("check", "get", "multi_get", "add"):
        _wrap(name)
    atexit.register(lambda: Path(out + ".reads").write_text(json.dumps(reads)))
    sys.argv = [worker, spec, out]
    runpy.run_path(worker, run_name="__main__")


if __name__ == "__main__":
    main()
