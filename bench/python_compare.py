"""Side by side in one process, under one emulated CPU budget, on a torchvision
model: batchtune.tune, Lightning's BatchSizeFinder (binsearch) and accelerate's
find_executable_batch_size. For each: trials, seconds, the size it returned,
whether that size really fits with the optimizer step (a batchtune probe with
no margin: the whole budget), and whether the model and optimizer were left as
they were.

    python bench/python_compare.py [--model resnet18] [--input 32] [--limit 256MiB]

Needs lightning and accelerate (scripts/setup installs them for the tests;
they are not dependencies of batchtune).
"""
import argparse
import copy
import json
import time

import torch
import torchvision

import batchtune


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--input", type=int, default=32, help="image side")
    p.add_argument("--limit", default="256MiB")
    p.add_argument("--json", default=None)
    p.add_argument("--only", default="batchtune,lightning,accelerate")
    return p.parse_args()


def make_model(name):
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(num_classes=10)


def make_batch_fn(side):
    def make_batch(n):
        g = torch.Generator().manual_seed(n)
        return torch.randn(n, 3, side, side, generator=g), torch.randint(0, 10, (n,), generator=g)
    return make_batch


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def fingerprint(model, optimizer):
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return sd, len(optimizer.state)


def same(a, b):
    sa, na = a
    sb, nb = b
    return na == nb and all(torch.equal(sa[k], sb[k]) for k in sa)


def really_fits(args, size, make_batch):
    """A fresh model and optimizer at `size`, the full step, the whole budget."""
    with batchtune.emulated_memory(args.limit):
        model = make_model(args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        r = batchtune.probe(model, opt, loss_fn, make_batch, batch_size=size, margin=0.0,
                            memory_limit=args.limit, steps=2)
    return r.fits, r.peak_bytes


def run_batchtune(args, make_batch):
    with batchtune.emulated_memory(args.limit):
        model = make_model(args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        before = fingerprint(model, opt)
        t0 = time.perf_counter()
        r = batchtune.tune(model, opt, loss_fn, make_batch, memory_limit=args.limit, sweep=False,
                           report=None, amp="off")
        seconds = time.perf_counter() - t0
        clean = same(before, fingerprint(model, opt))
    return {"tool": "batchtune.tune (predict, 10 % margin)", "trials": len(r.trials),
            "seconds": seconds, "size": r.max_batch_size, "left_as_it_was": clean}


def run_lightning(args, make_batch):
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    sizes = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model(args.model)
            self.batch_size = 2

        def training_step(self, batch, _):
            sizes.append(batch[0].shape[0])
            return loss_fn(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

        def train_dataloader(self):
            n = max(self.batch_size * 4, 8)
            with batchtune._core.uncounted():  # host data, not the emulated device's
                data = torch.utils.data.TensorDataset(*make_batch(n))
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    with batchtune.emulated_memory(args.limit):
        module = Module()
        before = ({k: v.detach().clone() for k, v in module.state_dict().items()}, 0)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        t0 = time.perf_counter()
        size = Tuner(trainer).scale_batch_size(module, mode="binsearch", steps_per_trial=3,
                                               init_val=2, max_trials=25)
        seconds = time.perf_counter() - t0
        after = ({k: v.detach().clone() for k, v in module.state_dict().items()}, 0)
    trials = sum(1 for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s)
    return {"tool": "Lightning BatchSizeFinder (binsearch)", "trials": trials, "seconds": seconds,
            "size": size, "left_as_it_was": same(before, after)}


def run_accelerate(args, make_batch):
    from accelerate.utils import find_executable_batch_size

    tried = []
    with batchtune.emulated_memory(args.limit):
        model = make_model(args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        before = fingerprint(model, opt)

        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size):
            tried.append(batch_size)
            batch = make_batch(batch_size)
            opt.zero_grad()
            loss_fn(model, batch).backward()
            opt.step()
            return batch_size

        t0 = time.perf_counter()
        size = train()
        seconds = time.perf_counter() - t0
        clean = same(before, fingerprint(model, opt))
    return {"tool": "accelerate find_executable_batch_size (from 128)", "trials": len(tried),
            "seconds": seconds, "size": size, "left_as_it_was": clean}


def main():
    args = parse()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    make_batch = make_batch_fn(args.input)
    rows = []
    runs = {"batchtune": run_batchtune, "lightning": run_lightning, "accelerate": run_accelerate}
    for name in args.only.split(","):
        row = runs[name](args, make_batch)
        row["really_fits"], row["peak_bytes"] = really_fits(args, row["size"], make_batch)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{args.model}, 3x{args.input}x{args.input}, SGD momentum, emulated {args.limit}")
    print(f"{'tool':50} {'trials':>6} {'seconds':>8} {'size':>6}  fits   no trace")
    for r in rows:
        print(f"{r['tool']:50} {r['trials']:6d} {r['seconds']:8.1f} {r['size']:6d}  "
              f"{'yes' if r['really_fits'] else 'NO':5}  {'yes' if r['left_as_it_was'] else 'no'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
