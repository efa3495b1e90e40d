"""Run by test_huggingface.py under torchrun: the Hugging Face helper on two
CPU processes (the Trainer's DDP over Gloo), the ranks under different
emulated budgets: one plan on both, then the Trainer trains with it."""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from conftest import exit_distributed_job  # noqa: E402
from test_huggingface import tiny_gpt2, token_data, training_args  # noqa: E402

import transformers  # noqa: E402

from batchtune.huggingface import tune_training_args  # noqa: E402

out = sys.argv[1]
args = training_args(out, per_device_train_batch_size=64, max_steps=2, ddp_backend="gloo")
rank = args.process_index  # the TrainingArguments join the process group
data = token_data()
model = tiny_gpt2()
limit = "10MiB" if rank == 0 else "8MiB"
tuned, result = tune_training_args(model, args, data, memory_limit=limit, report=None, amp="off",
                                   sweep=False, return_result=True, quiet=True)
trained = transformers.Trainer(model=model, args=tuned, train_dataset=data).train()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"own": max(t.batch_size for t in result.trials if t.fits),
               "micro_batch": tuned.per_device_train_batch_size,
               "accumulation": tuned.gradient_accumulation_steps,
               "world": args.world_size, "plan": result.plan.to_dict(),
               "global_step": trained.global_step,
               "weights": [p.detach().flatten()[:8].tolist() for p in model.parameters()][:4]}, f)
dist.barrier()
dist.destroy_process_group()
exit_distributed_job()
