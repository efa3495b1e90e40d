"""Run by test_lightning.py under torchrun: Lightning's ModelParallelStrategy as
FSDP2 alone (`fully_shard` in `configure_model`) on two CPU processes, each
rank under its own emulated budget: the tune's trials in lockstep, one plan."""
import json
import os
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from batchtune.lightning import BatchTune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import classify_loss, exit_distributed_job  # noqa: E402
from test_lightning import Module, image_data  # noqa: E402


class Sharded(Module):
    def __init__(self, data):
        super().__init__(data)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[1], self.net[3]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[0].shape[0])
        return classify_loss(self.net, batch)


rank = int(os.environ["RANK"])
limit = "8MiB" if rank == 0 else "6MiB"  # the ranks differ
torch.manual_seed(0)
tuner = BatchTune(memory_limit=limit, report=None, sweep=False, max_batch=4096)
strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[tuner])
module = Sharded(image_data(256))
trainer.fit(module)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"trials": [[t.batch_size, t.fits] for t in tuner.result.trials],
               "plan": tuner.plan.to_dict(), "batch_size": module.batch_size,
               "accumulate_grad_batches": trainer.accumulate_grad_batches,
               "global_step": trainer.global_step}, f)
trainer.strategy.barrier()
exit_distributed_job()
