#!/usr/bin/env python3
"""Two CPU processes (Gloo, torchrun) at the same emulated memory per process:
an MLP whose AdamW state dominates, wrapped in DistributedDataParallel
against sharded with FSDP2 (`fully_shard` on a CPU mesh). For each way,
`batchtune.tune` finds the largest micro-batch (no sweep, fp32), then a
`batchtune.Trainer` trains `--steps` steps at the plan and times them.

    python bench/ddp_fsdp.py [--rounds 3] [--memory-limit 48MiB] [--steps 8] [--json FILE]

The model: `--layers` Linear layers of `--width` (4 of 512 by default:
1.05 M parameters, 16.8 MB of parameters, gradients and AdamW state per
replica). DDP keeps all of it on every rank; FSDP2 keeps half of it and
gathers each layer's parameters around its forward and backward. The ways
take turns (`--rounds` each, the order rotated each round); the table gives
medians and the range. Samples/s counts both ranks' samples.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WAYS = ("ddp", "fsdp2")


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--memory-limit", default="48MiB")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", choices=WAYS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def model_of(args):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def worker(args):
    import torch.distributed as dist

    import batchtune

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    width = args.width
    model = model_of(args)
    if args.worker == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_batch(n):
        return torch.randn(n, width), torch.randint(0, 10, (n,))

    result = batchtune.tune(model, optimizer, loss_fn, make_batch, memory_limit=args.memory_limit,
                            report=None, amp="off", sweep=False, max_batch=1 << 14,
                            time_budget=120)
    plan = result.plan
    with batchtune.emulated_memory(args.memory_limit):
        trainer = batchtune.Trainer(model, optimizer, loss_fn, plan)
        trainer.step(make_batch(plan.batch_size))  # the optimizer state, untimed
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.step(make_batch(plan.batch_size))
        dist.barrier()
        seconds = time.perf_counter() - start
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({
            "micro_batch": plan.micro_batch_size,
            "samples_per_s": args.steps * plan.batch_size * dist.get_world_size() / seconds,
            "recoveries": len(trainer.recoveries)}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # a Gloo group a DDP model used outlives it (pytorch/pytorch#190489)


def run_way(args, way, out):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", __file__, "--worker", way,
           "--out", out, "--memory-limit", args.memory_limit, "--layers", str(args.layers),
           "--width", str(args.width), "--steps", str(args.steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"{way} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(Path(out).read_text())


def main():
    args = parse()
    if args.worker:
        worker(args)
        return
    runs = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = WAYS if r % 2 == 0 else WAYS[::-1]
            for way in order:
                runs[way].append(run_way(args, way, os.path.join(tmp, f"{way}{r}.json")))
                print(f"round {r + 1} {way}: {runs[way][-1]}", flush=True)
    table = {}
    for way, got in runs.items():
        speeds = [g["samples_per_s"] for g in got]
        table[way] = {"micro_batch": [g["micro_batch"] for g in got],
                      "samples_per_s_median": statistics.median(speeds),
                      "samples_per_s_range": [min(speeds), max(speeds)],
                      "recoveries": sum(g["recoveries"] for g in got)}
    ratio_batch = statistics.median(table["fsdp2"]["micro_batch"]) / \
        statistics.median(table["ddp"]["micro_batch"])
    ratio_speed = table["fsdp2"]["samples_per_s_median"] / table["ddp"]["samples_per_s_median"]
    print(f"{'way':6} {'micro-batch':>12} {'samples/s (median)':>20} {'range':>18}")
    for way, t in table.items():
        lo, hi = t["samples_per_s_range"]
        print(f"{way:6} {statistics.median(t['micro_batch']):>12.0f} "
              f"{t['samples_per_s_median']:>20.0f} {lo:>8.0f}-{hi:<8.0f}")
    print(f"fsdp2 / ddp: micro-batch {ratio_batch:.2f}x, samples/s {ratio_speed:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"ways": table, "batch_ratio": ratio_batch,
                                               "speed_ratio": ratio_speed, "args": vars(args)},
                                              indent=1))


if __name__ == "__main__":
    main()
