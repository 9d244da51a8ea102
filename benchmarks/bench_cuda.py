"""Benchmark the CUDA paths of distinit.broadcast against torch, side by side in one run (needs a GPU).

Run:  python benchmarks/bench_cuda.py [--quick]

One GPU is enough, and that bounds what can be measured: NCCL refuses two ranks on one device, so
1. NCCL, world 1: the per-call cost of distinit's check on the NCCL path (the header all_gather on the
   device, the payload broadcast) against a raw ``dist.broadcast`` of the same CUDA tensor, 1 KB ... 256 MB;
   ``broadcast_module`` of model B (2000 x 1000 fp32 on the GPU) against a per-parameter loop,
   ``_broadcast_coalesced`` and one flat broadcast; ``broadcast_object`` against ``broadcast_object_list``.
   No byte crosses a link at world 1: these are overheads (Python, kernel launches, synchronisation).
2. gloo, world 2, both ranks on the one GPU, 64 MB CUDA tensors: raw ``dist.broadcast`` (gloo stages
   through host memory) against ``broadcast_tensor`` over the network, shared memory and shared memory
   with ``zero_copy`` (receivers copy the mapped pages to their device).

Each figure is the slowest rank's time from a barrier to completion after ``torch.cuda.synchronize()``;
minimum and median over interleaved rounds. Writes ``benchmarks/results/cuda.{md,json}``; on a machine
without CUDA it prints why and writes nothing (the committed results stay those of the last GPU run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = {"1 KB": 1 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20, "256 MB": 256 << 20}


def _once(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    if dist.get_backend() == "nccl":  # NCCL reduces CUDA tensors only: reduce a device copy, read that back
        elapsed = elapsed.cuda()
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def compare(fns: dict[str, Callable[[], Any]], reps: int, inner: int = 1) -> dict[str, dict[str, float]]:
    """Seconds per call of each function (slowest rank), min and median over interleaved rounds."""
    from bench_broadcast import compare as interleaved

    return interleaved(fns, reps, inner, once=_once)


def _nccl_sizes(reps: int) -> dict[str, dict[str, float]]:
    from distinit.broadcast import broadcast_tensor

    out: dict[str, dict[str, float]] = {}
    for label, nbytes in SIZES.items():
        src = torch.randn(nbytes // 4, device="cuda")
        inner = 20 if nbytes <= 1 << 20 else 2
        out.update(
            compare(
                {
                    f"tensor {label}: torch dist.broadcast": lambda s=src: dist.broadcast(s, 0),
                    f"tensor {label}: distinit broadcast_tensor": lambda s=src: broadcast_tensor(s),
                },
                reps,
                inner,
            )
        )
    return out


def _nccl_module(reps: int) -> dict[str, dict[str, float]]:
    from distinit.broadcast import broadcast_module, broadcast_object

    model = torch.nn.Module()
    for i in range(2000):
        model.register_parameter(f"p{i}", torch.nn.Parameter(torch.randn(1000, device="cuda")))
    params = [p.data for p in model.parameters()]
    flat = torch.cat([p.reshape(-1) for p in params])
    cfg = {"lr": 3e-4, "steps": 100_000, "layers": list(range(64)), "tags": {f"k{i}": "v" * 20 for i in range(16)}}

    def loop() -> None:
        for p in params:
            dist.broadcast(p, 0)

    def bol() -> None:
        dist.broadcast_object_list([cfg], 0, device=torch.device("cuda"))

    out = compare(
        {
            "model B: torch per-parameter loop": loop,
            "model B: torch _broadcast_coalesced (250 MiB)": lambda: dist._broadcast_coalesced(
                dist.group.WORLD, params, 250 << 20, 0
            ),
            "model B: one flat broadcast": lambda: dist.broadcast(flat, 0),
            "model B: distinit broadcast_module": lambda: broadcast_module(model),
        },
        reps,
    )
    out.update(
        compare(
            {
                "object: torch broadcast_object_list": bol,
                "object: distinit broadcast_object": lambda: broadcast_object(cfg, type=dict[str, Any]),
            },
            reps,
            inner=10,
        )
    )
    return out


def _gloo_cuda(rank: int, reps: int) -> dict[str, dict[str, float]]:
    from distinit.broadcast import broadcast_tensor

    nbytes = 64 << 20
    src = torch.randn(nbytes // 4, device="cuda")
    buf = src if rank == 0 else torch.empty_like(src)
    fns: dict[str, Callable[[], Any]] = {"gloo 64 MB CUDA: torch dist.broadcast": lambda: dist.broadcast(buf, 0)}
    for via, zero_copy in (("network", False), ("shm", False), ("shm", True)):
        label = f"gloo 64 MB CUDA: distinit via={via}" + (" zero_copy" if zero_copy else "")
        fns[label] = lambda v=via, z=zero_copy: broadcast_tensor(
            src if rank == 0 else None, device="cuda", via=v, zero_copy=z
        )
    return compare(fns, reps)


def _worker(rank: int, world: int, store: str, backend: str, reps: int, queue: Any) -> None:
    torch.cuda.set_device(0)
    kwargs: dict[str, Any] = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
    dist.init_process_group(
        backend,
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
        **kwargs,
    )
    try:
        result = {**_nccl_sizes(reps), **_nccl_module(reps)} if backend == "nccl" else _gloo_cuda(rank, reps)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def run_world(world: int, backend: str, reps: int) -> dict[str, dict[str, float]]:
    from _common import spawn_world

    result: dict[str, dict[str, float]] = spawn_world(
        _worker, world, (backend, reps), limit_s=600, what=f"cuda benchmark {backend} world {world}"
    )
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def render(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """One table per world; each distinit row carries its ratio to the torch row it is measured against."""
    lines: list[str] = []
    for world, rows in results.items():
        lines += [f"## {world}", "", "| case | min | median | vs torch (min) |", "|---|---|---|---|"]
        for label, t in rows.items():
            base = _baseline(label, rows)
            ratio = f"{t['min'] / rows[base]['min']:.2f}x `{base.split(': ', 1)[1]}`" if base else ""
            lines.append(f"| {label} | {_ms(t['min'])} | {_ms(t['median'])} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def _render_init(runs: list[dict[str, Any]]) -> str:
    lines = [
        "## init, NCCL world 1",
        "",
        "A fresh process each; from before CUDA initialises (`torch.cuda.set_device` + `init_process_group` vs "
        "`setup()`, which binds the device itself) to the first all_reduce done.",
        "",
    ]
    lines += ["| run | torch init_process_group(device_id) | distinit setup() | difference |", "|---|---|---|---|"]
    for i, run in enumerate(runs, 1):
        t, d = run.get("torch"), run.get("distinit")
        if isinstance(t, float) and isinstance(d, float):
            lines.append(f"| {i} | {_ms(t)} | {_ms(d)} | {_ms(d - t)} |")
        else:
            lines.append(f"| {i} | {t} | {d} | |")
    return "\n".join(lines) + "\n"


def _baseline(label: str, rows: dict[str, dict[str, float]]) -> str | None:
    if "distinit" not in label:
        return None
    case = label.split(": ", 1)[0]
    # the best torch method; "one flat broadcast" is the floor shown beside it, not a method a user has
    torch_rows = [k for k in rows if k.startswith(case + ": ") and "torch" in k]
    return min(torch_rows, key=lambda k: rows[k]["min"]) if torch_rows else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda: skipped, torch.cuda.is_available() is False (nothing written)")
        return 0
    from _common import load_average, machine_facts

    load_at_start = load_average()
    reps = 3 if args.quick else 10
    results: dict[str, dict[str, dict[str, float]]] = {}
    for world, backend in ((1, "nccl"), (2, "gloo")):
        t0 = time.perf_counter()
        results[f"{backend} world {world}"] = run_world(world, backend, reps)
        print(f"[{backend} world {world}] done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    from bench_init import nccl  # setup("nccl") vs init_process_group("nccl", device_id=...), world 1

    init = [nccl() for _ in range(1 if args.quick else 3)]
    report = render(results) + "\n" + _render_init(init)
    print(report)
    facts = machine_facts(load_at_start=load_at_start)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"machine_facts": facts, "results": results, "init": init}
    (args.out / "cuda.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "cuda.md").write_text(
        f"# CUDA benchmark\n\n`{facts['command']}` on {facts['gpu']}, {facts['cpus']} CPUs, torch {facts['torch']}, "
        f"{facts['when']} (load {facts['load_average_at_end'][0]:.1f} at the end). Times are the minimum over "
        f"{reps} interleaved rounds (median beside it), slowest rank, after `torch.cuda.synchronize()`.\n\n{report}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
