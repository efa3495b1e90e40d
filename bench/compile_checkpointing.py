"""The training configuration as well as the batch, on the CPU under one
emulated budget: eager against `torch.compile` (inductor, the real CPU
backend) and activation checkpointing off against on, for a small
transformer and a small convnet, each configuration tuned by
`batchtune.tune` as it will train.

Columns: the largest batch, the chosen batch and its samples/s with the
95 % interval, the compile seconds and recompiles (compiled rows), the
tune's seconds; then `checkpointing="auto"`'s choice and its reason. The
configurations alternate within a round and rounds repeat; the table gives
each figure's median over the rounds (and its range).

    python bench/compile_checkpointing.py [--rounds 2] [--json out.json]
"""
import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import batchtune


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--time-budget", type=float, default=30)
    p.add_argument("--only", default="transformer,convnet")
    p.add_argument("--json", default=None)
    return p.parse_args()


class Layer(torch.nn.Module):
    """A pre-norm transformer layer: what checkpointing recomputes."""

    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(torch.nn.Module):
    def __init__(self, vocab=512, width=128, heads=4, layers=4, length=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(Layer(width, heads) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)
        self.vocab, self.length = vocab, length

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class ConvBlock(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class ConvNet(torch.nn.Module):
    def __init__(self, channels=32, blocks=4, classes=10):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = torch.nn.Sequential(*[ConvBlock(channels) for _ in range(blocks)])
        self.head = torch.nn.Linear(channels, classes)

    def forward(self, x):
        x = self.blocks(torch.relu(self.stem(x)))
        return self.head(x.mean((2, 3)))


def workload(name):
    """(make the model, its block class, make_batch, loss_fn, memory limit)."""
    if name == "transformer":
        def make_batch(n):
            ids = torch.randint(0, 512, (n, 64))
            return ids, ids

        def loss_fn(model, batch):
            ids, labels = batch
            return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
        return Transformer, Layer, make_batch, loss_fn, "160MiB"

    def make_batch(n):
        return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))

    def loss_fn(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)
    return ConvNet, ConvBlock, make_batch, loss_fn, "192MiB"


CONFIGURATIONS = ["eager", "compiled", "checkpointing", "auto"]


def run(name, configuration, budget):
    make_model, block, make_batch, loss_fn, limit = workload(name)
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kwargs = dict(memory_limit=limit, amp="off", time_budget=budget, report=None, base_batch=64)
    if configuration == "compiled":
        model = torch.compile(model)
    elif configuration == "checkpointing":
        kwargs.update(checkpointing="on", checkpoint_modules=[block])
    elif configuration == "auto":
        kwargs.update(checkpointing="auto", checkpoint_modules=[block], time_budget=2 * budget)
    started = time.perf_counter()
    r = batchtune.tune(model, optimizer, loss_fn, make_batch, **kwargs)
    seconds = time.perf_counter() - started
    row = next((x for x in r.sweep if x.batch_size == r.chosen_batch_size), None)
    reason = next((x for x in r.plan.reasons if x.startswith("checkpointing fits")), "")
    return {"max": r.max_batch_size, "chosen": r.chosen_batch_size,
            "samples_per_s": row.samples_per_s if row else None,
            "ci": list(row.samples_per_s_ci) if row and row.samples_per_s_ci else None,
            "compile_seconds": r.compile_seconds, "recompiles": r.recompiles,
            "seconds": seconds, "checkpointing": r.plan.checkpointing, "reason": reason}


def median(values):
    values = [v for v in values if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def main():
    args = parse()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = {}
    for name in args.only.split(","):
        for round_ in range(args.rounds):
            # Alternate the order from round to round: a burst of load hits
            # other configurations each time.
            order = CONFIGURATIONS if round_ % 2 == 0 else list(reversed(CONFIGURATIONS))
            for configuration in order:
                out = run(name, configuration, args.time_budget)
                results.setdefault(name, {}).setdefault(configuration, []).append(out)
                print(name, configuration, json.dumps(out), flush=True)
    print(f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {args.rounds} round(s), time budget {args.time_budget} s")
    print("| model | configuration | largest batch | chosen | samples/s (median, range) | "
          "compile s | recompiles | tune s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, configurations in results.items():
        for configuration, runs in configurations.items():
            m = {k: median([x[k] for x in runs]) for k in
                 ("max", "chosen", "samples_per_s", "compile_seconds", "recompiles", "seconds")}
            fmt = lambda t, f="{:.0f}": "—" if t is None else (  # noqa: E731
                f.format(t[0]) + ("" if t[1] == t[2] else f" ({f.format(t[1])}-{f.format(t[2])})"))
            print(f"| {name} | {configuration} | {fmt(m['max'])} | {fmt(m['chosen'])} | "
                  f"{fmt(m['samples_per_s'])} | {fmt(m['compile_seconds'], '{:.1f}')} | "
                  f"{fmt(m['recompiles'])} | {fmt(m['seconds'])} |")
        for out in configurations.get("auto", []):
            print(f"auto ({name}): {out['checkpointing']}: {out['reason']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
