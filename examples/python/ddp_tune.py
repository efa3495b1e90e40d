"""Data parallel: every rank tunes on its own device through your process
group; the job's micro-batch is the smallest rank's, and every rank gets rank
0's plan. On a CPU (Gloo, an emulated 256 MiB device per rank):

    torchrun --standalone --nproc_per_node 2 examples/python/ddp_tune.py

On GPUs use the nccl backend and leave out memory_limit.
"""
import os

import torch
import torch.distributed as dist

import batchtune

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend)
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_batch(n):
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


result = batchtune.tune(model, optimizer, loss_fn, make_batch, device=device,
                        memory_limit="256MiB" if device.type == "cpu" else None,
                        target_batch=1024, time_budget=60, report="tune.html" if rank == 0 else None)
plan = result.plan
print(f"rank {rank}: micro-batch {plan.micro_batch_size} x {plan.accumulation_steps} accumulation "
      f"x {plan.world_size} ranks = global {plan.global_batch_size}, lr {plan.lr:.2e}")

# Train: DDP averages the gradients over the ranks (each micro-batch's
# backward, so the accumulated sum is the global batch's mean gradient).
ddp = torch.nn.parallel.DistributedDataParallel(model)
trainer = batchtune.Trainer(ddp, optimizer, loss_fn, plan, device=device)
for step in range(2):
    loss = trainer.step(make_batch(plan.batch_size))
    if rank == 0:
        print(f"step {step}: loss {loss:.3f}")
dist.destroy_process_group()
