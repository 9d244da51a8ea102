"""One rank of a tiny Lightning fit on CPU with DistinitEnvironment; writes what it trained as.

Usage: ``python lightning_fit.py OUTDIR`` under a launcher (mpirun, torchrun). Each rank writes
``OUTDIR/rank-<torch rank>.json`` with Lightning's and torch's view of its rank.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from distinit.integrations.lightning import DistinitEnvironment


class Tiny(L.LightningModule):
    """One linear layer; records the ranks once training ends."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.out = out

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        record = {
            "lightning_global_rank": self.trainer.global_rank,
            "lightning_node_rank": self.trainer.node_rank,
            "lightning_world_size": self.trainer.world_size,
            "torch_rank": dist.get_rank(),
            "torch_world_size": dist.get_world_size(),
            "steps": self.trainer.global_step,
        }
        (self.out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record))


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    env = DistinitEnvironment()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        num_nodes=1,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=30)),
        plugins=[env],
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer.fit(Tiny(out), DataLoader(data, batch_size=4))
    # Lightning leaves the group up; a gloo group still alive at interpreter exit can abort the process
    # ("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489). Seen once in CI,
    # after training had finished on every rank. End as torch documents: destroy the group.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
