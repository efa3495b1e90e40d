"""Run by test_lightning_lengths.py under torchrun: Lightning's DDP on two CPU
processes (Gloo) training an epoch by a token budget's plan (given, so that
no tune runs), each rank noting the samples it trained."""
import json
import os
import sys

import lightning.pytorch as pl
import torch

from batchtune.lightning import BatchTune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import exit_distributed_job  # noqa: E402
from test_lightning_lengths import LM, label_tokens, ragged  # noqa: E402

out = sys.argv[1]
rank = int(os.environ["RANK"])
torch.manual_seed(0)
lengths, data = ragged()
with open(os.path.join(out, "plan.json")) as f:
    plan = json.load(f)
tuner = BatchTune(lengths="auto", loss_items=label_tokens, report=None)
tuner.load_state_dict({"plan": plan})  # as a resumed fit: the plan, no tune
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[tuner])
module = LM(data)
trainer.fit(module)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"trained": module.trained, "shapes": module.shapes,
               "micro_batches": len(tuner.token_sampler), "rank": tuner.token_sampler.rank,
               "replicas": tuner.token_sampler.num_replicas,
               "accumulate_grad_batches": trainer.accumulate_grad_batches,
               "global_step": trainer.global_step}, f)
trainer.strategy.barrier()
exit_distributed_job()
