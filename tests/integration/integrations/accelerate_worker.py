"""One rank of a tiny accelerate job on CPU; prints what accelerate and torch think the world is.

Usage: ``python accelerate_worker.py MODE`` under a launcher (mpirun, srun, torchrun). Prints one line
``ACCELERATE_RECORD <json>`` and exits 0 (an error building the ``Accelerator`` is recorded, not raised,
so every rank reports). Modes:

* ``plain``: ``Accelerator(cpu=True)`` alone, as accelerate's docs show it.
* ``setup``: ``distinit.setup()`` first, then ``Accelerator(cpu=True)``, one training step of a
  prepared model and optimizer on rank-specific data, and a ``gather`` of every rank's index.
* ``setup-default``: ``distinit.setup()`` first, then ``Accelerator()`` without ``cpu=True``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import distinit

RECORD_PREFIX = "ACCELERATE_RECORD "


def accelerate_view(accelerator: Any) -> dict[str, Any]:
    """What accelerate resolved: its distributed type and the three indices a training script uses."""
    return {
        "distributed_type": str(accelerator.distributed_type).rsplit(".", 1)[-1],
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "num_processes": accelerator.num_processes,
        "is_main_process": accelerator.is_main_process,
    }


def train_one_step(accelerator: Any) -> dict[str, Any]:
    """One DDP step on data that differs per rank; the parameters every rank ends with, and a gather."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)  # the same initial weights everywhere, so only the step can make them differ
    model = torch.nn.Linear(4, 1)
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1000 + accelerator.process_index)
    data = TensorDataset(torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    x, y = next(iter(loader))
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    flat = torch.cat([p.detach().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
    params = accelerator.gather(flat.unsqueeze(0))
    indices = accelerator.gather(torch.tensor([accelerator.process_index]))
    return {"gathered_indices": indices.tolist(), "params_before": before, "params_by_rank": params.tolist()}


def main(mode: str) -> dict[str, Any]:
    """Run MODE on this rank and return its record."""
    record: dict[str, Any] = {"mode": mode}
    group = None
    if mode.startswith("setup"):
        result = distinit.setup(deadline=60.0, pg_timeout=timedelta(seconds=30))
        env = result.env
        record["distinit"] = {"rank": env.rank, "local_rank": env.local_rank, "world_size": env.world_size}
        group = dist.group.WORLD
    from accelerate import Accelerator

    try:
        accelerator = Accelerator() if mode == "setup-default" else Accelerator(cpu=True)
    except (ValueError, RuntimeError) as exc:
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return record
    record["accelerate"] = accelerate_view(accelerator)
    if dist.is_initialized():
        record["torch"] = {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
        record["reused_group"] = group is not None and dist.group.WORLD is group
    if mode == "setup":
        record.update(train_one_step(accelerator))
    return record


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two shared cores; accelerate warns and picks its own otherwise
    torch.set_num_threads(1)
    print(RECORD_PREFIX + json.dumps(main(sys.argv[1])), flush=True)
