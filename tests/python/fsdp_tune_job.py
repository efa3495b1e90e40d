"""Run by test_distributed.py under torchrun: an MLP sharded with FSDP2
(`fully_shard` on a CPU mesh, Gloo) tuned on two ranks, an out-of-memory
forced on rank 1 alone above 40 samples, in its forward or in its backward;
the ranks' shards and optimizer state as they were before the tune."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import batchtune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import exit_distributed_job, fail_in_backward  # noqa: E402

out, where = sys.argv[1], sys.argv[2]
# A collective left unmatched fails within 60 s rather than hanging.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        big = rank == 1 and x.shape[0] > 40
        if big and where == "forward":
            raise torch.OutOfMemoryError("out of memory forced on rank 1 (forward)")
        y = torch.relu(self.lin(x))
        if big and where == "backward":
            return fail_in_backward(y, "out of memory forced on rank 1 (backward)")
        return y


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), Block(32), Block(32), torch.nn.Linear(32, 4))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
# One real step first: the optimizer has state the tune must leave alone.
F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
optimizer.step()
optimizer.zero_grad()


def local_state():
    return ([p.to_local().clone() for p in model.parameters()],
            [v.to_local().clone() if hasattr(v, "to_local") else v.clone()
             for s in optimizer.state.values() for v in s.values()])


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_batch(n):
    return torch.randn(n, 16), torch.randint(0, 4, (n,))


before = local_state()
result = batchtune.tune(model, optimizer, loss_fn, make_batch, memory_limit="256MiB",
                        report=None, amp="off", max_batch=128, sweep=False)
after = local_state()
same = all(torch.equal(a, b) for a, b in zip(before[0] + before[1], after[0] + after[1]))
# The model trains on after the tune: the same step on both ranks.
F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
optimizer.step()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"max": result.max_batch_size, "unchanged": same,
               "trials": [[t.batch_size, t.fits, t.error] for t in result.trials],
               "plan": result.plan.to_dict()}, f)
dist.barrier()
dist.destroy_process_group()
exit_distributed_job()
