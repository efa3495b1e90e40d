"""Run by test_lightning.py under torchrun: Lightning's DDP on two CPU
processes (Gloo), each rank tuning under its own emulated budget."""
import json
import os
import sys

import lightning.pytorch as pl
import torch

import batchtune
from batchtune.lightning import BatchTune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import exit_distributed_job  # noqa: E402
from test_lightning import Module, image_data  # noqa: E402

rank = int(os.environ["RANK"])
limit = "8MiB" if rank == 0 else "6MiB"  # the ranks differ; the job takes the smaller
torch.manual_seed(0)
data = image_data(256)
tuner = BatchTune(target_batch=128, memory_limit=limit, report=None, sweep=False)
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[tuner])
module = Module(data)
trainer.fit(module)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"own": tuner.result.chosen_batch_size, "plan": tuner.plan.to_dict(),
               "batch_size": module.batch_size,
               "accumulate_grad_batches": trainer.accumulate_grad_batches,
               "global_step": trainer.global_step}, f)
trainer.strategy.barrier()
exit_distributed_job()
