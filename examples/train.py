"""A training script whose only distributed start-up is ``setup()``; it runs unchanged under any launcher.

    torchrun --nproc-per-node 4 examples/train.py                     # one node
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint node0:29400 examples/train.py   # two nodes
    srun --nodes 2 --ntasks-per-node 4 python examples/train.py       # Slurm: MASTER_ADDR/PORT derived
    mpirun -np 4 -x MASTER_ADDR=node0 -x MASTER_PORT=29500 python examples/train.py   # Open MPI

``setup()`` resolves the world from whichever launcher started the process (and exports RANK,
WORLD_SIZE, MASTER_ADDR, ...), binds ``cuda:LOCAL_RANK`` when a GPU is there, forms the process group
with a bounded, retrying rendezvous (misconfiguration such as a duplicate rank fails in seconds with a
message naming both processes), and destroys the group at exit.
"""

from __future__ import annotations

import argparse
import json
import logging

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distinit.init import setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds allowed for rendezvous")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    ctx = setup(deadline=args.deadline, attempt_timeout=30.0)
    env, device = ctx.env, torch.device(ctx.device)

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts them from rank 0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1000 + env.rank)  # each rank sees different data
    true_w = torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16
    loss = torch.zeros((), device=device)
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=generator).to(device)
        y = x @ true_w.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= env.world_size
    if env.rank == 0:
        summary = {
            "launcher": env.launcher,
            "world_size": env.world_size,
            "backend": ctx.report.backend,
            "store": ctx.report.store,
            "rendezvous_s": ctx.report.elapsed,
            "attempts": len(ctx.report.attempts),
            "steps": args.steps,
            "mean_loss": round(float(mean_loss), 6),
        }
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
