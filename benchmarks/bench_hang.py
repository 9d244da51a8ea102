"""Benchmark: what the live hang verdict costs a training loop, and what its judge costs at 1k and 10k ranks (issue 32).

Part ``overhead``: world 4, gloo on loopback, ``setup()`` with the hang verdict on (the default) against
``setup(hang_verdict=False)``, in fresh worlds run interleaved (off, on, off, on, ...). Each step is ``--step-ms``
of CPU work on every rank (a busy loop, so that sampling competes for the CPU as it would in a real step) and one
``all_reduce`` of 1 KiB. Each world runs ``--seconds`` s after a warm-up; the figure is seconds per step, rank 0's,
and the ratio on/off of the medians. Target: <= 1.01 (1 %) on a 10 ms step.

Part ``scale``: the judge's work per beat with ``N`` simulated ranks, on a real TCPStore served in this process:
``N`` positions written (what the ranks publish once a beat), then what rank 0 does every beat: one ``multi_get``
of the ``N`` position keys, parsing them, and :func:`distinit.hang.judge` (no hang: the usual case; and a hang with
one culprit). Reported: milliseconds per beat and bytes read per beat, at each ``--ranks`` (default 1,000 and
10,000). One sample of the per-rank side too: ``Sampler.sample()`` plus ``encode()`` in microseconds.

    python benchmarks/bench_hang.py [--parts overhead scale] [--rounds 3] [--seconds 20] [--out benchmarks/results]

Writes ``hang.json`` and ``hang.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import load_average, machine_facts, spawn_world  # noqa: E402


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for _ in range(200):
            x += 1


def _loop(rank: int, world: int, _store: str, port: int, on: bool, step: float, seconds: float, queue: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch
    import torch.distributed as dist

    import distinit

    torch.set_num_threads(1)
    distinit.setup("gloo", hang_verdict=on, deadline=120)
    tensor = torch.ones(256)
    for _ in range(20):  # warm-up
        _busy(step)
        dist.all_reduce(tensor)
    dist.barrier()
    steps, began = 0, time.perf_counter()
    end = began + seconds
    while True:
        _busy(step)
        dist.all_reduce(tensor)
        steps += 1
        flag = torch.tensor([1.0 if time.perf_counter() >= end else 0.0])
        if steps % 10 == 0:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # stop together
            if flag.item() > 0:
                break
    per_step = (time.perf_counter() - began) / steps
    distinit.teardown()
    if rank == 0:
        queue.put({"steps": steps, "per_step_s": per_step})


def overhead(rounds: int, seconds: float, step_ms: float) -> dict[str, Any]:
    rows: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for variant in ("off", "on"):
            result = spawn_world(
                _loop,
                4,
                (_port(), variant == "on", step_ms / 1000, seconds),
                limit_s=seconds + 240,
                what=f"the {variant} world",
            )
            rows[variant].append(result["per_step_s"])
            print(f"  {variant}: {result['per_step_s'] * 1000:.3f} ms/step ({result['steps']} steps)", flush=True)
    off, on = statistics.median(rows["off"]), statistics.median(rows["on"])
    return {
        "world": 4,
        "step_ms": step_ms,
        "seconds_per_world": seconds,
        "per_step_s": rows,
        "median_off_s": off,
        "median_on_s": on,
        "ratio_on_off": round(on / off, 4),
        "target_ratio": 1.01,
    }


def scale(ranks: list[int]) -> dict[str, Any]:
    import torch.distributed as dist

    from distinit.hang import Position, Sampler, judge, states_of, still_of

    out: dict[str, Any] = {"ranks": {}}
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for n in ranks:
        waiting = Position("collective", "all_reduce", "train.py:88", counts={"world": 1234}, still=0.5, gap=0.2)
        values = [waiting.encode()] * n
        for r in range(n):
            store.set(f"n{n}/pos/{r}", values[r])
        keys = [f"n{n}/pos/{r}" for r in range(n)]
        read_s, look_s, judge_s = [], [], []
        size = 0
        for _ in range(5):
            t0 = time.perf_counter()
            got = store.multi_get(keys)
            t1 = time.perf_counter()
            assert max(map(still_of, got)) < 10.0  # the usual beat: nobody stayed put that long, nothing parsed
            t2 = time.perf_counter()
            states = states_of(dict(enumerate(got)), ranks=range(n), silent_for={})  # type: ignore[arg-type]
            verdict = judge(states, threshold=10.0, silent_after=2.5)
            t3 = time.perf_counter()
            assert verdict is None
            size = sum(len(v) for v in got)
            read_s.append(t1 - t0)
            look_s.append(t2 - t1)
            judge_s.append(t3 - t2)
        hung = Position("collective", "all_reduce", "train.py:88", counts={"world": 1234}, still=12.0)
        culprit = Position("code", "load_batch", "data.py:41", counts={"world": 1233}, still=12.0).encode()
        got = [hung.encode()] * (n - 1) + [culprit]
        t0 = time.perf_counter()
        states = states_of(dict(enumerate(got)), ranks=range(n), silent_for={})  # type: ignore[arg-type]
        verdict = judge(states, threshold=10.0, silent_after=2.5)
        hang_s = time.perf_counter() - t0
        assert verdict is not None
        assert verdict.culprits == (n - 1,)
        out["ranks"][n] = {
            "multi_get_ms": round(statistics.median(read_s) * 1000, 2),
            "first_look_ms": round(statistics.median(look_s) * 1000, 2),
            "parse_and_judge_ms": round(statistics.median(judge_s) * 1000, 2),
            "judge_a_hang_ms": round(hang_s * 1000, 2),
            "bytes_read_per_beat": size,
            "verdict": verdict.text[:200],
        }
        print(f"  {n} ranks: {out['ranks'][n]}", flush=True)
    done = threading.Event()
    thread = threading.Thread(target=done.wait, daemon=True)
    thread.start()
    sampler = Sampler(lambda: {"world": 5}, thread_id=thread.ident)
    t0 = time.perf_counter()
    for _ in range(2000):
        position = sampler.sample()
        assert position is not None
        position.encode()
    out["sample_and_encode_us"] = round((time.perf_counter() - t0) / 2000 * 1e6, 1)
    done.set()
    print(f"  one rank's sample + encode: {out['sample_and_encode_us']} µs", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["overhead", "scale"], choices=["overhead", "scale"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    start = load_average()
    results: dict[str, Any] = {}
    if "overhead" in args.parts:
        print("overhead (world 4, gloo, interleaved worlds):", flush=True)
        results["overhead"] = overhead(args.rounds, args.seconds, args.step_ms)
    if "scale" in args.parts:
        print("scale (the judge's work per beat, simulated ranks):", flush=True)
        results["scale"] = scale(args.ranks)
    results["machine_facts"] = machine_facts(load_at_start=start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hang.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["# Hang verdict: cost", ""]
    if "overhead" in results:
        o = results["overhead"]
        lines += [
            f"World 4, gloo, {o['step_ms']:.0f} ms of CPU work + one all_reduce per step; {args.rounds} interleaved "
            f"worlds of {o['seconds_per_world']:.0f} s per variant; rank 0's seconds per step, median.",
            "",
            "| hang verdict | ms per step | ratio |",
            "|---|---|---|",
            f"| off (`setup(hang_verdict=False)`) | {o['median_off_s'] * 1000:.3f} | 1 |",
            f"| on (the default) | {o['median_on_s'] * 1000:.3f} | {o['ratio_on_off']:.4f} (target <= 1.01) |",
            "",
        ]
    if "scale" in results:
        s = results["scale"]
        lines += [
            "The judge's work per beat (rank 0), simulated ranks on a real TCPStore in one process: read every "
            "position, the first look (``still`` alone: the usual beat ends here), a full parse and judgement with no "
            f"hang, and one with a hang. One rank's sample + encode: {s['sample_and_encode_us']} µs.",
            "",
            "| ranks | multi_get (ms) | first look (ms) | parse + judge (ms) | judge a hang (ms) | bytes per beat |",
            "|---|---|---|---|---|---|",
        ]
        for n, row in s["ranks"].items():
            lines.append(
                f"| {n} | {row['multi_get_ms']} | {row['first_look_ms']} | {row['parse_and_judge_ms']} | "
                f"{row['judge_a_hang_ms']} | "
                f"{row['bytes_read_per_beat']} |"
            )
        lines.append("")
    facts = results["machine_facts"]
    load = f"{facts.get('load_average_at_start')} -> {facts['load_average_at_end']}"
    lines.append(f"Machine: {facts['cpus']} CPUs, load {load}, torch {facts['torch']}.")
    (args.out / "hang.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
