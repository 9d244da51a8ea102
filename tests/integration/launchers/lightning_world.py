"""One task of tiny Lightning fits on CPU under a real launcher, in both forms of docs/integrations.md.

Usage: ``python lightning_world.py MODE`` where MODE is

* ``forms``: first the plugin-only form (``Trainer(plugins=[DistinitEnvironment()])``, Lightning forms the
  group), then, after ``destroy_process_group()``, the ``setup()`` form (``distinit.setup()``, then
  ``DistinitEnvironment(env=result.env)``; on the next port, so the two groups never share a store). In each
  form, before the real fit: ``devices`` one too many, then ``num_nodes`` one too many, each expected to be
  refused before DDP init;
* ``wrong-node-rank``: the ``setup()`` form after ``export NODE_RANK=0`` (the hand-written line that makes
  every node believe it is node 0).

Prints one JSON line per step: ``{"step": ..., "ok": true, <Lightning's ranks>, "indices": [...]}`` for a fit,
``{"step": ..., "error": <class>, "message": ..., "ddp_init": <did this rank enter DDP init>}`` for a refusal.
Every expected error is printed and the task goes on (and exits 0): mpirun and srun kill a job's other tasks
as soon as one exits non-zero, which would lose their records.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import distinit
from distinit.integrations.lightning import DistinitEnvironment

#: No logger, checkpoint, progress bar or summary: only the JSON lines go to stdout.
QUIET: dict[str, Any] = dict.fromkeys(
    ("logger", "enable_checkpointing", "enable_progress_bar", "enable_model_summary"), False
)
#: Items in the training set: each rank's DistributedSampler shard is recorded, they must cover it exactly.
ITEMS = 32


class Recording(DDPStrategy):
    """Lightning's DDP strategy, noting whether this rank entered DDP init (``setup_distributed``)."""

    entered = False

    def setup_distributed(self) -> None:
        Recording.entered = True
        super().setup_distributed()


class Tiny(L.LightningModule):
    """One linear layer; records the indices of the items this rank trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.indices: list[int] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        index, x, y = batch
        self.indices.extend(int(i) for i in index)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def emit(step: str, **record: Any) -> None:
    print(json.dumps({"step": step, **record}), flush=True)


def fit(step: str, env: DistinitEnvironment, devices: int, num_nodes: int) -> None:
    """One epoch of DDP on CPU; prints Lightning's view of the ranks, or the distinit error."""
    Recording.entered = False
    try:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=devices,
            num_nodes=num_nodes,
            strategy=Recording(process_group_backend="gloo", timeout=timedelta(seconds=30)),
            plugins=[env],
            max_epochs=1,
            **QUIET,
        )
        index = torch.arange(ITEMS)
        data = TensorDataset(index, torch.randn(ITEMS, 4), torch.randn(ITEMS, 1))
        model = Tiny()
        trainer.fit(model, DataLoader(data, batch_size=4))
    except distinit.DistinitError as exc:
        emit(step, error=type(exc).__name__, message=str(exc), ddp_init=Recording.entered)
        return
    emit(
        step,
        ok=True,
        lightning_global_rank=trainer.global_rank,
        lightning_local_rank=trainer.local_rank,
        lightning_node_rank=trainer.node_rank,
        lightning_world_size=trainer.world_size,
        torch_rank=dist.get_rank(),
        torch_world_size=dist.get_world_size(),
        indices=model.indices,
        steps=trainer.global_step,
    )


def run_form(form: str, env: DistinitEnvironment, devices: int, num_nodes: int) -> None:
    """The two refusals, then the real fit, in one form."""
    fit(f"{form}-devices-wrong", env, devices + 1, num_nodes)
    fit(f"{form}-nodes-wrong", env, devices, num_nodes + 1)
    fit(f"{form}-fit", env, devices, num_nodes)


def plugin_form() -> int | None:
    """The plugin-only form; returns the port it used (None when it did not form a group)."""
    try:
        env = DistinitEnvironment()
    except distinit.DistinitError as exc:
        emit("plugin-refused", error=type(exc).__name__, message=str(exc), ddp_init=False)
        return None
    world = env.env
    assert world.local_world_size is not None, world
    if world.num_nodes is None:  # MPICH hydra on several hosts: the Trainer itself must refuse, on every rank
        fit("plugin-refused", env, world.local_world_size, 1)
        return None
    run_form("plugin", env, world.local_world_size, world.num_nodes)
    return env.main_port


def setup_form(port: int | None) -> None:
    environ = dict(os.environ)
    if port is not None:
        environ["MASTER_PORT"] = str(port + 1)  # a new store: the plugin form's may still be closing
    try:
        world = distinit.setup("gloo", environ=environ, deadline=60, attempt_timeout=30).env
    except distinit.DistinitError as exc:
        emit("setup-refused", error=type(exc).__name__, message=str(exc), ddp_init=False)
        return
    assert world.local_world_size is not None and world.num_nodes is not None, world
    emit("setup-env", node_rank=world.node_rank, exported_node_rank=os.environ.get("NODE_RANK"))
    run_form("setup", DistinitEnvironment(env=world), world.local_world_size, world.num_nodes)


def killed_form(victim: int) -> None:
    """``setup()``, then rank ``victim`` SIGKILLs itself and the others fit: the plugin's settings exchange fails."""
    world = distinit.setup("gloo", deadline=60, attempt_timeout=30).env
    assert world.local_world_size is not None and world.num_nodes is not None, world
    emit("killed-ready", rank=world.rank, pid=os.getpid())
    dist.barrier()
    if world.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    fit("killed-fit", DistinitEnvironment(env=world), world.local_world_size, world.num_nodes)


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1] == "killed":
        killed_form(int(sys.argv[2]))
        return
    if sys.argv[1] == "wrong-node-rank":
        os.environ["NODE_RANK"] = "0"
        setup_form(None)
        return
    port = plugin_form()
    if dist.is_initialized():
        dist.destroy_process_group()
    setup_form(port)


if __name__ == "__main__":
    main()
