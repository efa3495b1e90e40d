#!/usr/bin/env python3
"""Which gradient noise scale says what a larger batch costs? lenet on
Fashion-MNIST with Adam, in plain PyTorch (the same layers, data and lr rule
as `batchtune train --model lenet --data fashion-mnist`), two checks:

    python bench/noise_scale_check.py noise [--batch 32] [--steps 1800]
    python bench/noise_scale_check.py samples [--grid 32,64,128,256] [--seeds 0,1,2]

`noise` trains at `--batch` and, every `--check-every` steps, estimates
B_simple = tr(Σ)/|G|² from `--chunks` gradients of 32 samples each (4,096
samples by default: a value to compare with), both of the raw gradient and
of the gradient preconditioned by Adam's second moment, g/(√v̂ + ε) (Pollux,
OSDI 2021, for the Adam family; v̂ as the optimizer holds it before the
step), with the share of parameters whose v̂ is 0. Beside them it prints
what `train --adapt` reads from its own measurements (the first half of a
step's batch against the whole, one step in 10): the moving average (decay
0.95) and the low end of ±1 jackknife standard error over the last 32; and
what successive steps give for free, every step, averaged with decay 0.99:
each step's gradient against the mean of it and the previous step's (as
Pollux's implementation measures without accumulation), and the second
difference of three steps, g1 − 2·g2 + g3, which `--adapt` reads (a steady
change of the gradient between steps cancels there).

`samples` trains a fixed batch of each `--grid` size from each seed to
`--target` test accuracy (evaluated every `--eval-samples` samples) and
prints the samples it took: 1 − S(B0)/S(B) is what a batch B costs per
sample against B0, the quantity E(B) = (B_noise + B0)/(B_noise + B) models.
"""
import argparse
import gzip
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # kFashionMnistMean, kFashionMnistStd
BETA2, EPS = 0.999, 1e-8    # torch.optim.Adam's defaults
BASE_LR, BASE_BATCH = 1e-3, 64  # the plan's default lr and the batch it belongs to
CHUNK = 32                  # samples per gradient of the reference estimate
WINDOW, DECAY = 32, 0.95    # kNoiseScaleWindow, kDefaultNoiseScaleDecay
MEASURE_EVERY = 10          # kAdaptNoiseEvery
SUCCESSIVE_DECAY = 0.99     # one measurement a step: about the last 100 count


def load(data, split):
    def idx(name, offset):
        with gzip.open(os.path.join(data, name)) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)
    x = idx(f"{split}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = idx(f"{split}-labels-idx1-ubyte.gz", 8)
    x = (torch.tensor(x, dtype=torch.float32) / 255 - MEAN) / STD
    return x, torch.tensor(y, dtype=torch.long)


def lenet():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 10))


def adam(model, batch):
    return torch.optim.Adam(model.parameters(), lr=BASE_LR * math.sqrt(batch / BASE_BATCH))


def gradient(model, x, y):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.detach().flatten() for p in model.parameters()])


def reference(grads):
    """B_simple from K gradients of CHUNK samples each (rows of `grads`)."""
    trace = CHUNK * grads.var(0).sum()
    g2 = grads.mean(0).pow(2).sum() - trace / (grads.shape[0] * CHUNK)
    return float(trace / g2)


def unbiased(small_batch, small, big_batch, big):
    """McCandlish's |G|² and tr(Σ) from gradients at two batch sizes; `small`
    may hold several gradients of `small_batch` (their squared norms averaged)."""
    s2 = float(small.pow(2).sum()) / (small.shape[0] if small.dim() > 1 else 1)
    b2 = float(big.pow(2).sum())
    g2 = (big_batch * b2 - small_batch * s2) / (big_batch - small_batch)
    return g2, (s2 - b2) / (1 / small_batch - 1 / big_batch)


def adapt_reading(window, ema):
    g2, tr = np.array(window).T
    n = len(window)
    leave_one_out = (tr.sum() - tr) / (g2.sum() - g2)
    se = math.sqrt((n - 1) / n * ((leave_one_out - leave_one_out.mean()) ** 2).sum())
    return ema[1] / ema[0], max(0.0, tr.sum() / g2.sum() - se)


def noise(args):
    torch.manual_seed(args.seed)
    x, y = load(args.data, "train")
    chunks = torch.Generator().manual_seed(args.seed + 1)
    model = lenet()
    opt = adam(model, args.batch)
    half = args.batch // 2
    window, ema, successive, second, previous, earlier = [], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], \
        None, None
    order, pos = torch.randperm(len(x)), 0
    print(f"batch {args.batch}, Adam lr {opt.param_groups[0]['lr']:.3g}; reference from "
          f"{args.chunks} x {CHUNK} samples\n")
    print("| step | samples | raw | preconditioned | v̂ = 0 | --adapt reads (EMA, low end) "
          "| successive steps | second difference |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for step in range(args.steps + 1):
        if step > 0 and step % args.check_every == 0:
            picked = torch.randperm(len(x), generator=chunks)[:args.chunks * CHUNK]
            grads = torch.stack([gradient(model, x[i], y[i]) for i in picked.split(CHUNK)])
            states = [opt.state[p] for p in model.parameters()]
            v = torch.cat([s["exp_avg_sq"].flatten() for s in states])
            v_hat = v / (1 - BETA2 ** float(states[0]["step"]))
            pre = reference(grads / (v_hat.sqrt() + EPS))
            est, low = adapt_reading(window[-WINDOW:], ema)
            print(f"| {step} | {step * args.batch} | {reference(grads):.0f} | {pre:.3g} | "
                  f"{float((v == 0).float().mean()) * 100:.1f} % | {est:.0f}, {low:.0f} | "
                  f"{successive[1] / successive[0]:.0f} | {second[1] / second[0]:.0f} |",
                  flush=True)
        if step == args.steps:
            break
        if pos + args.batch > len(x):
            order, pos = torch.randperm(len(x)), 0
        i = order[pos:pos + args.batch]
        pos += args.batch
        if step > 0 and step % MEASURE_EVERY == 0:
            # As the training step splits it: the first half alone, then the whole.
            small = gradient(model, x[i[:half]], y[i[:half]])
            big = (small + gradient(model, x[i[half:]], y[i[half:]])) / 2
            g2, tr = unbiased(half, small, args.batch, big)
            window.append((g2, tr))
            ema = [DECAY * ema[0] + (1 - DECAY) * g2, DECAY * ema[1] + (1 - DECAY) * tr]
        g = gradient(model, x[i], y[i])
        if previous is not None:
            # Two batches of B on nearly the same parameters: B against 2B.
            g2, tr = unbiased(args.batch, torch.stack([g, previous]), 2 * args.batch,
                              (g + previous) / 2)
            d = SUCCESSIVE_DECAY
            successive = [d * successive[0] + (1 - d) * g2, d * successive[1] + (1 - d) * tr]
        if earlier is not None:
            # E|g1 − 2·g2 + g3|² = 6·tr(Σ)/B; E of the mean |g|² = |G|² + tr(Σ)/B.
            tr = float((earlier - 2 * previous + g).pow(2).sum()) * args.batch / 6
            g2 = float(torch.stack([earlier, previous, g]).pow(2).sum()) / 3 - tr / args.batch
            d = SUCCESSIVE_DECAY
            second = [d * second[0] + (1 - d) * g2, d * second[1] + (1 - d) * tr]
        earlier = previous
        previous = g.clone()
        opt.step()


def samples(args):
    x, y = load(args.data, "train")
    xt, yt = load(args.data, "t10k")
    grid = [int(b) for b in args.grid.split(",")]
    print(f"samples to {args.target * 100:.0f} % test accuracy (evaluated every "
          f"{args.eval_samples})\n")
    print("| seed | " + " | ".join(f"batch {b}" for b in grid) + " |")
    print("|---:|" + "---:|" * len(grid))
    for seed in (int(s) for s in args.seeds.split(",")):
        cells = []
        for batch in grid:
            torch.manual_seed(seed)
            model = lenet()
            opt = adam(model, batch)
            seen, order, pos, reached = 0, torch.randperm(len(x)), 0, None
            while reached is None and seen < args.max_samples:
                if pos + batch > len(x):
                    order, pos = torch.randperm(len(x)), 0
                i = order[pos:pos + batch]
                pos += batch
                gradient(model, x[i], y[i])
                opt.step()
                before, seen = seen, seen + batch
                if seen // args.eval_samples > before // args.eval_samples:
                    with torch.no_grad():
                        accuracy = float((model(xt).argmax(1) == yt).float().mean())
                    if accuracy >= args.target:
                        reached = seen
            cells.append(str(reached) if reached else "-")
        print(f"| {seed} | " + " | ".join(cells) + " |", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=["noise", "samples"])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--seed", type=int, default=0, help="noise: the run's seed")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--check-every", type=int, default=200)
    p.add_argument("--chunks", type=int, default=128)
    p.add_argument("--grid", default="32,64,128,256")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--eval-samples", type=int, default=1600)
    p.add_argument("--max-samples", type=int, default=200000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    noise(args) if args.check == "noise" else samples(args)


if __name__ == "__main__":
    main()
