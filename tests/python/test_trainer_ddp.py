"""The Trainer on several ranks cannot fall out of step: two processes under
torchrun (Gloo), an out-of-memory forced on one rank only in the middle of a
step, under DistributedDataParallel (and a branch only one rank uses) and
with an FSDP2 model (in its forward, and in its backward)."""
import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import batchtune
from conftest import fail_in_backward

SAMPLES, FEATURES, CLASSES = 16, 6, 3
LR = 0.1


class Net(torch.nn.Module):
    """An MLP with a side branch a batch may leave unused."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(FEATURES, 8)
        self.head = torch.nn.Linear(8, CLASSES)
        self.side = torch.nn.Linear(FEATURES, CLASSES)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x, use_side=True):
        self.seen += x.shape[0]
        out = self.head(torch.relu(self.body(x)))
        return out + self.side(x) if use_side else out


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(SAMPLES, FEATURES, generator=g), torch.randint(0, CLASSES, (SAMPLES,),
                                                                      generator=g)


def _plan():
    return batchtune.Plan(micro_batch_size=4, accumulation_steps=2, global_batch_size=16, lr=LR,
                          lr_scaling="none", warmup_steps=0)


def _loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _reference(use_side_per_rank):
    """One SGD step on all 16 samples' mean loss, each rank's half with or
    without the side branch, in one process."""
    model = Net()
    x, y = _data()
    losses = [F.cross_entropy(model(x[8 * r:8 * r + 8], use_side), y[8 * r:8 * r + 8])
              for r, use_side in enumerate(use_side_per_rank)]
    (sum(losses) / len(losses)).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_an_out_of_memory_on_one_rank_mid_step_recovers_on_both_with_one_average(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", __file__,
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name, use_side in (("oom", (True, True)), ("unused", (True, False))):
        want = _reference(use_side)
        for rank, got in enumerate(ranks):
            for a, b in zip(got[name]["weights"], want):
                assert torch.allclose(a, b, atol=1e-6), (name, rank)
    # Rank 1 ran out of memory at its second micro-batch of 4; both ranks
    # halved and ran the step again, its samples kept.
    for got in ranks:
        assert got["oom"]["micro_batch_size"] == 2
        assert len(got["oom"]["recoveries"]) == 1
        assert "the logical batch 8 kept" in got["oom"]["recoveries"][0]
    assert "on another rank" in ranks[0]["oom"]["recoveries"][0]
    assert "forced on rank 1" in ranks[1]["oom"]["recoveries"][0]
    # Rank 0's buffers on every rank, as DDP's forward hands them out.
    assert ranks[0]["oom"]["seen"] == ranks[1]["oom"]["seen"]
    # FSDP2: rank 1's out-of-memory in its forward or backward at the second
    # micro-batch reaches rank 0 at its next meeting; both retry, and the step
    # is the one over all 16 samples.
    for where in ("forward", "backward"):
        want = _reference((True, True))
        for rank, got in enumerate(ranks):
            step = got[f"fsdp_{where}"]
            for a, b in zip(step["weights"], want):
                assert torch.allclose(a, b, atol=1e-6), (where, rank)
            assert step["micro_batch_size"] == 2 and len(step["recoveries"]) == 1, step


def _job(out: Path) -> None:
    import torch.distributed as dist

    # A collective left unmatched fails within 60 s rather than hanging.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    x, y = _data()
    batch = (x[8 * rank:8 * rank + 8], y[8 * rank:8 * rank + 8])
    results = {}

    calls = {"n": 0}

    def loss_oom_on_rank_1(model, b):
        calls["n"] += 1
        if rank == 1 and calls["n"] == 2 and b[0].shape[0] > 2:
            raise torch.OutOfMemoryError("out of memory forced on rank 1")
        return _loss(model, b)

    model = torch.nn.parallel.DistributedDataParallel(Net())
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=LR),
                                loss_oom_on_rank_1, _plan())
    trainer.step(batch)
    results["oom"] = {"weights": [p.detach().clone() for p in model.module.parameters()],
                      "micro_batch_size": trainer.micro_batch_size,
                      "recoveries": trainer.recoveries,
                      "seen": float(model.module.seen)}

    def loss_side_on_rank_0(model, b):
        x, y = b
        return F.cross_entropy(model(x, use_side=rank == 0), y)

    model = torch.nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=LR),
                                loss_side_on_rank_0, _plan())
    trainer.step(batch)
    results["unused"] = {"weights": [p.detach().clone() for p in model.module.parameters()]}

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    for where in ("forward", "backward"):
        model = Net()
        for layer in (model.body, model.head, model.side):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        calls["n"] = 0

        def loss_fsdp(model, b):
            calls["n"] += 1
            fail = rank == 1 and calls["n"] == 2 and b[0].shape[0] > 2
            if fail and where == "forward":
                raise torch.OutOfMemoryError("out of memory forced on rank 1")
            loss = _loss(model, b)
            return fail_in_backward(loss, "out of memory forced on rank 1 (backward)") if fail \
                else loss

        trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=LR),
                                    loss_fsdp, _plan())
        trainer.step(batch)
        results[f"fsdp_{where}"] = {
            "weights": [p.full_tensor().detach().clone() for p in model.parameters()],
            "micro_batch_size": trainer.micro_batch_size, "recoveries": trainer.recoveries}
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from conftest import exit_distributed_job

    _job(Path(sys.argv[1]))
    exit_distributed_job()
