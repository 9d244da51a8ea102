"""One task of a tiny Lightning fit on CPU under a real launcher, with the world from ``distinit.setup()``.

Usage: ``python lightning_world.py MODE`` where MODE is
``setup`` (``distinit.setup()``, then ``Trainer(devices=env.local_world_size, num_nodes=env.num_nodes,
plugins=[DistinitEnvironment(env=env)])``) or ``wrong-node-rank`` (the same after ``export NODE_RANK=0``,
the hand-written line that makes every node believe it is node 0). Prints one JSON line: Lightning's and
torch's view of the rank, or the distinit error.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import distinit
from distinit.integrations.lightning import DistinitEnvironment


class Tiny(L.LightningModule):
    """One linear layer; prints the ranks once training ends."""

    def __init__(self, env: distinit.DistEnv) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.env = env

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        record = {
            "ok": True,
            "lightning_global_rank": self.trainer.global_rank,
            "lightning_node_rank": self.trainer.node_rank,
            "lightning_local_rank": self.trainer.local_rank,
            "lightning_world_size": self.trainer.world_size,
            "torch_rank": dist.get_rank(),
            "torch_world_size": dist.get_world_size(),
            "node_rank": self.env.node_rank,
            "node_rank_source": list(self.env.sources.get("node_rank", ())),
            "exported_node_rank": os.environ.get("NODE_RANK"),
            "steps": self.trainer.global_step,
        }
        print(json.dumps(record), flush=True)


def fail(exc: distinit.DistinitError) -> None:
    """Print the error and exit 0: mpirun and srun kill a job's other tasks as soon as one exits non-zero,
    which would lose their records; the printed error is what the tests check."""
    print(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}), flush=True)
    raise SystemExit(0)


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1] == "wrong-node-rank":
        os.environ["NODE_RANK"] = "0"
    try:
        env = distinit.setup("gloo", deadline=60, attempt_timeout=30).env
    except distinit.DistinitError as exc:
        fail(exc)
    assert env.local_world_size is not None and env.num_nodes is not None
    try:
        fit(env)
    except distinit.DistinitError as exc:  # DistinitEnvironment refusing Lightning's numbering
        fail(exc)


def fit(env: distinit.DistEnv) -> None:
    """Three steps of DDP on CPU, with the devices and nodes of the verified world."""
    assert env.local_world_size is not None and env.num_nodes is not None
    trainer = L.Trainer(
        accelerator="cpu",
        devices=env.local_world_size,
        num_nodes=env.num_nodes,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=30)),
        plugins=[DistinitEnvironment(env=env)],
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer.fit(Tiny(env), DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
