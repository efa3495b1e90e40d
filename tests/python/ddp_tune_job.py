"""Run by test_distributed.py under torchrun: each rank tunes under its own
emulated budget through the user's Gloo process group. `plain`: a module as
it is; `ddp`: the same wrapped in DistributedDataParallel with AdamW, tuned
with the sweep (the trials in lockstep: each step averages the gradients),
then two Trainer steps with the plan; `compiled-ddp`: that DDP model under
`torch.compile`, tuned compiled and in lockstep, then trained; `short`,
`save-error`, `restore-error`: a rank that cannot start, or that stops with an
error between steps, and what each rank says."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import batchtune

sys.path.insert(0, os.path.dirname(__file__))
from conftest import (classify_loss, exit_distributed_job, image_batch,  # noqa: E402
                      small_convnet)

out, kind = sys.argv[1], sys.argv[2]
# A collective left unmatched fails within 60 s rather than hanging.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = small_convnet()
# The ranks differ: the job's maximum is the smaller one's.
limit = "24MiB" if rank == 0 else "16MiB"
if kind == "short":
    # Rank 1's limit is below what its model already holds: no rank waits.
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                       memory_limit="24MiB" if rank == 0 else "2KiB", report=None, amp="off")
        error = None
    except batchtune.Error as e:
        error = str(e)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"error": error}, f)
    dist.barrier()
    dist.destroy_process_group()
    exit_distributed_job()
if kind in ("save-error", "restore-error"):
    # Rank 1 stops with an error outside any step, at its third trial: taking
    # the snapshot (before the trial's first meeting), or putting the model
    # back after it fitted (before the result is agreed). Rank 0 must learn
    # of it at its next meeting, not wait in a collective until the timeout.
    from batchtune import _trial
    method = "save" if kind == "save-error" else "restore"
    original = getattr(_trial.Subject, method)
    calls = [0]

    def failing(self):
        calls[0] += 1
        if rank == 1 and calls[0] == 3:
            raise RuntimeError(f"{method} failed on rank 1 (injected)")
        return original(self)

    setattr(_trial.Subject, method, failing)
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                       memory_limit=limit, report=None, amp="off", max_batch=256, sweep=False)
        error = None
    except Exception as e:  # noqa: BLE001 - each rank's error is the test's subject
        error = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"error": error, "calls": calls[0]}, f)
    dist.barrier()
    dist.destroy_process_group()
    exit_distributed_job()
if kind == "compiled-ddp":
    # DDP compiled after wrapping, as PyTorch advises: tuned compiled, in lockstep.
    model = torch.compile(torch.nn.parallel.DistributedDataParallel(model), backend="aot_eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    result = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                            memory_limit=limit, report=None, amp="off", max_batch=256,
                            sweep=False, target_batch=512)
elif kind == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    result = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                            memory_limit=limit, report=None, amp="off", max_batch=256,
                            target_batch=512, time_budget=60)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    result = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                            memory_limit=limit, report=None, amp="off", max_batch=512,
                            sweep=False, target_batch=1024)
own = max(t.batch_size for t in result.trials if t.fits)
record = {"rank": rank, "own": own, "max": result.max_batch_size,
          "recompiles": result.recompiles,
          "plan": result.plan.to_dict(),
          "trials": [[t.batch_size, t.fits, t.error] for t in result.trials]}
if kind == "ddp":
    # An out-of-memory forced on rank 1 alone, inside the forward, above 40
    # samples: rank 0 learns of it before it averages, and both agree.
    def forced(model, batch):
        if rank == 1 and batch[0].shape[0] > 40:
            raise torch.OutOfMemoryError("out of memory forced on rank 1")
        return classify_loss(model, batch)

    forced_result = batchtune.tune(model, optimizer, forced, image_batch((3, 16, 16)),
                                   memory_limit=limit, report=None, amp="off", max_batch=256,
                                   sweep=False)
    record["forced"] = {"max": forced_result.max_batch_size,
                        "trials": [[t.batch_size, t.fits, t.error]
                                   for t in forced_result.trials]}
if kind != "plain":  # two steps of the plan: the same weights on both ranks
    trainer = batchtune.Trainer(model, optimizer, classify_loss, result.plan)
    make = image_batch((3, 16, 16))
    torch.manual_seed(rank)
    for _ in range(2):
        trainer.step(make(result.plan.batch_size))
    record["weights"] = [p.detach().flatten()[:16].tolist() for p in model.parameters()]
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
# Both ranks done before either tears down: a rank leaving early closes the
# Gloo pairs under the other, which then aborts in its shutdown.
dist.barrier()
dist.destroy_process_group()
exit_distributed_job()
