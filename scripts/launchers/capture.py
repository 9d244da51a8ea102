#!/usr/bin/env python3
"""Capture the real environment of every launch shape, for table tests and presets.

Starts the emulated Slurm cluster (``cluster.py``), runs each shape of ``shapes.py`` with a
task that only records its environment, and writes
``tests/integration/launchers/captures/<shape>.json``: a list with one dict per task (sorted by
the launcher's rank), holding only launcher-related variables (``task.LAUNCHER_PREFIXES`` and
``task.LAUNCHER_NAMES``), exactly as the launcher set them. ``captures/README.md`` lists the
command behind each file. Nothing explicit is added: multi-node mpirun/hydra captures carry no
``MASTER_ADDR``/``MASTER_PORT``, as a bare launch would not.

Needs root (Slurm daemons, munged). Usage::

    .venv/bin/python scripts/launchers/capture.py [--out DIR] [SHAPE ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cluster  # noqa: E402
from shapes import SHAPES, SHAPES_BY_NAME, Context, run_shape  # noqa: E402

DEFAULT_OUT = HERE.parent.parent / "tests" / "integration" / "launchers" / "captures"


def main(argv: list[str] | None = None) -> int:
    """Run the chosen shapes (default: all) and write their captures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", help="shape names (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    # A capture is one world; launches forming several (concurrent steps) are not captured.
    chosen = [SHAPES_BY_NAME[n] for n in args.shapes] if args.shapes else [s for s in SHAPES if s.worlds == 1]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="distinit-capture-"))
    slurm = None
    try:
        if any("slurm" in s.needs for s in chosen):
            slurm = cluster.start(work / "cluster")
        for shape in chosen:
            ctx = Context(python=sys.executable, outdir=work / shape.name, cluster=slurm, with_master=False)
            result = run_shape(shape, ctx, [])
            envs = [r["env"] for r in result.records]
            (args.out / f"{shape.name}.json").write_text(json.dumps(envs, indent=1) + "\n", encoding="utf-8")
            print(f"{shape.name}: {len(envs)} tasks, {result.seconds:.1f} s")
        _write_readme(args.out)
    finally:
        if slurm is not None:
            cluster.stop(work / "cluster")
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _write_readme(out: Path) -> None:
    lines = [
        "# Real launcher environments",
        "",
        "Written by `scripts/launchers/capture.py` (do not edit by hand). Each `<shape>.json` is a list",
        "with one dict per launched task, sorted by the launcher's rank, holding only launcher-related",
        "variables (`SLURM_*`, `SLURMD_*`, `OMPI_*`, `PMI_*`, `PMIX_*`, `MPI_LOCAL*`, `HYDRA_*`, `PALS_*`,",
        "`TORCHELASTIC_*`, `ROLE_*`, `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,",
        "`GROUP_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`).",
        "",
        "Set-up: Slurm 22.05 with three `slurmd -N dnodeN` on one host (8 CPUs declared per node),",
        "Open MPI 4.1 with made-up hosts `fakehost-a/b` through a fake rsh agent, MPICH 4.0 hydra",
        "`-launcher fork`, torchrun from torch 2.13; all as root on one machine, so every node name is",
        "this machine. Nothing explicit was added: no `MASTER_ADDR`/`MASTER_PORT` for mpirun/hydra.",
        "`SLURM_CONF` points at the harness's own slurm.conf (it is not in `/etc/slurm`).",
        "",
        "| shape | launcher | tasks | command |",
        "|---|---|---|---|",
    ]
    for shape in SHAPES:
        if (out / f"{shape.name}.json").exists():
            lines.append(f"| `{shape.name}` | {shape.launcher} | {shape.world_size} | {shape.description} |")
    lines += [
        "",
        "`slurm-batch-step` and `slurm-salloc-shell` are single processes that were not started by",
        "srun: a strict resolver must refuse them (NotLaunchedError).",
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
