"""Run by test_huggingface.py under `accelerate launch --use_fsdp
--fsdp_version 2` on two CPU processes (Gloo): a GPT-2 sharded with FSDP2
(`fully_shard` on each block and the whole), tuned by the Hugging Face
helper in lockstep under different emulated budgets and left as it was,
then two steps of the plan with `batchtune.Trainer`. (accelerate shards only
on GPUs: on CPUs its Trainer would wrap the sharded model in DDP, which
cannot take DTensors, so the Hugging Face Trainer does not train here.)"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(__file__))
from conftest import exit_distributed_job  # noqa: E402
from test_huggingface import tiny_gpt2, token_data, training_args  # noqa: E402

import batchtune  # noqa: E402
from batchtune.huggingface import tune_training_args  # noqa: E402

out = sys.argv[1]
args = training_args(out, per_device_train_batch_size=64, max_steps=2, ddp_backend="gloo")
rank = args.process_index  # the TrainingArguments join the process group
data = token_data(256)
model = tiny_gpt2()
for block in model.transformer.h:
    fully_shard(block)
fully_shard(model)
before = [p.to_local().clone() for p in model.parameters()]
limit = "10MiB" if rank == 0 else "8MiB"
tuned, result = tune_training_args(model, args, data, memory_limit=limit, report=None, amp="off",
                                   sweep=False, return_result=True, quiet=True)
unchanged = all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
optimizer = torch.optim.AdamW(model.parameters(), lr=tuned.learning_rate)
trainer = batchtune.Trainer(model, optimizer, lambda m, batch: m(**batch).loss, result.plan)
per_step = result.plan.batch_size
losses = []
for step in range(2):
    samples = data[(2 * step + rank) * per_step:(2 * step + rank + 1) * per_step]
    losses.append(trainer.step({k: torch.stack([s[k] for s in samples]) for k in samples[0]}))
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"own": max(t.batch_size for t in result.trials if t.fits),
               "trials": [[t.batch_size, t.fits] for t in result.trials],
               "micro_batch": tuned.per_device_train_batch_size,
               "accumulation": tuned.gradient_accumulation_steps,
               "world": args.world_size, "plan": result.plan.to_dict(), "unchanged": unchanged,
               "losses": losses}, f)
dist.barrier()
dist.destroy_process_group()
exit_distributed_job()
