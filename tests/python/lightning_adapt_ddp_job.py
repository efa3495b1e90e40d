"""Run by test_lightning_adapt.py under torchrun: BatchTune(adapt=True) on
Lightning's DDP over two CPU processes (Gloo); rank 0's scripted policy
decides for both."""
import json
import os
import sys

import lightning.pytorch as pl
import torch

from batchtune.lightning import BatchTune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import exit_distributed_job  # noqa: E402
from test_lightning_adapt import LIMIT, Module, Record, StepClock, _data  # noqa: E402

rank = int(os.environ["RANK"])
torch.set_num_threads(1)
clock = StepClock()
tuner = BatchTune(memory_limit=LIMIT, sweep=False, max_batch=8, adapt=True, adapt_every=5,
                  clock=clock, report=None)
# Rank 1's script would differ: rank 0 decides for both.
record = Record(tuner, clock, {5: 32, 15: 16, 25: 64} if rank == 0 else {10: 64})
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=35, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[tuner, record])
module = Module(_data())
trainer.fit(module)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"schedule": tuner.batch_schedule, "batches": record.batches,
               "plan": tuner.plan.to_dict(),
               "weights": [p.detach().flatten().tolist()[:8] for p in module.parameters()]}, f)
trainer.strategy.barrier()
exit_distributed_job()
