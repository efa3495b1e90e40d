"""Run by test_distributed.py under torchrun: each rank tunes under its own
emulated budget through the user's Gloo process group."""
import json
import os
import sys

import torch
import torch.distributed as dist

import batchtune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import (classify_loss, exit_distributed_job, image_batch,  # noqa: E402
                      small_convnet)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = small_convnet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
# The ranks differ: the job's maximum is the smaller one's.
limit = "24MiB" if rank == 0 else "16MiB"
result = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                        memory_limit=limit, report=None, amp="off", max_batch=512, sweep=False,
                        target_batch=1024)
own = max(t.batch_size for t in result.trials if t.fits)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "own": own, "max": result.max_batch_size,
               "plan": result.plan.to_dict()}, f)
# Both ranks done before either tears down: a rank leaving early closes the
# Gloo pairs under the other, which then aborts in its shutdown.
dist.barrier()
dist.destroy_process_group()
exit_distributed_job()
