"""Side by side where Python users train, on the CPU under one emulated budget:

1. Lightning: its `BatchSizeFinder(mode="binsearch")` callback against
   `batchtune.lightning.BatchTune`, on one LightningModule (a small transformer
   encoder classifying token sequences of long-tailed lengths, padded per
   batch, shuffled), each with a fresh module made inside the budget, each then
   training one full epoch at the size it chose, under the same budget.
2. Hugging Face: `TrainingArguments(auto_find_batch_size=True)` against
   `batchtune.huggingface.tune_training_args`, on a small GPT-2 made from a
   config (no download), the user's arguments asking for a global batch of
   `--hf-batch`, one epoch each.

Columns: trials, seconds spent finding the size, the size chosen, whether
that size trains a full epoch without an out-of-memory, samples/s over that
epoch (and for Hugging Face the effective global batch it trains with).

    python bench/python_integrations.py [--limit 64MiB] [--hf-limit 48MiB] [--json out.json]

Needs lightning and transformers (scripts/setup installs them for the tests).
"""
import argparse
import gc
import json
import math
import os
import tempfile
import time

import torch

import batchtune


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--limit", default="64MiB", help="Lightning: the emulated device")
    p.add_argument("--samples", type=int, default=1536)
    p.add_argument("--hf-limit", default="48MiB", help="Hugging Face: the emulated device")
    p.add_argument("--hf-samples", type=int, default=768)
    p.add_argument("--hf-batch", type=int, default=128, help="the global batch the args configure")
    p.add_argument("--time-budget", type=float, default=60)
    p.add_argument("--only", default="lightning,huggingface")
    p.add_argument("--json", default=None)
    return p.parse_args()


# -- Lightning ---------------------------------------------------------------

VOCAB = 1000


def long_tailed_lengths(n, seed=0):
    """Mostly 16-64 tokens; one sample in 200 of 256 (a long document)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 65, (n,), generator=g)
    long = torch.rand(n, generator=g) < 1 / 200
    lengths[long] = 256
    return lengths


class TokenData(torch.utils.data.Dataset):
    def __init__(self, n):
        with batchtune._core.uncounted():  # host data, not the emulated device's
            self.lengths = long_tailed_lengths(n)
            g = torch.Generator().manual_seed(1)
            self.tokens = [torch.randint(1, VOCAB, (int(k),), generator=g) for k in self.lengths]
            self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i], self.labels[i]


def pad_collate(samples):
    tokens, labels = zip(*samples)
    x = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True)
    return x, torch.stack(labels)


def make_module_class(pl):
    class Classifier(pl.LightningModule):
        def __init__(self, data, batch_size=8):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 64, padding_idx=0)
            layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, 2)
            self.data = data
            self.batch_size = batch_size
            self.sizes = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.sizes.append(x.shape[0])
            h = self.encoder(self.embed(x), src_key_padding_mask=x == 0)
            loss = torch.nn.functional.cross_entropy(self.head(h.mean(1)), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size, shuffle=True,
                                               collate_fn=pad_collate,
                                               generator=torch.Generator().manual_seed(2))
    return Classifier


def lightning_row(args, which):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import BatchSizeFinder

    from batchtune.lightning import BatchTune

    Classifier = make_module_class(pl)
    data = TokenData(args.samples)
    found = {}

    class TimedFinder(BatchSizeFinder):
        def scale_batch_size(self, trainer, pl_module):
            t0 = time.perf_counter()
            super().scale_batch_size(trainer, pl_module)
            found["seconds"] = time.perf_counter() - t0
            found["trial_steps"] = len(pl_module.sizes)

    class EpochClock(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            found["epoch_start"] = time.perf_counter()
            found["epoch_first"] = len(pl_module.sizes)

        def on_train_epoch_end(self, trainer, pl_module):
            found["epoch_seconds"] = time.perf_counter() - found["epoch_start"]

    if which == "lightning":
        tool = TimedFinder(mode="binsearch")
        name = "Lightning `BatchSizeFinder` (binsearch, 3 steps per trial, from 2)"
    else:
        tool = BatchTune(memory_limit=args.limit, report=None, time_budget=args.time_budget)
        name = "`batchtune.lightning.BatchTune` (sweep, throughput, 10 % margin)"
    root = tempfile.mkdtemp(prefix="bt_bench_")
    row = {"tool": name}
    with batchtune.emulated_memory(args.limit):
        module = Classifier(data)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=root,
                             num_sanity_val_steps=0, callbacks=[tool, EpochClock()])
        t0 = time.perf_counter()
        try:
            trainer.fit(module)
            row["full_epoch"] = "yes"
        except torch.OutOfMemoryError as e:
            done = len(module.sizes) - found.get("epoch_first", len(module.sizes))
            row["full_epoch"] = (f"no: out of memory at batch {done + 1} of "
                                 f"{math.ceil(len(data) / module.batch_size)}")
            row["oom"] = str(e).split("\n", 1)[0][:160]
            del e
        total = time.perf_counter() - t0
    if which == "lightning":
        sizes = module.sizes[:found.get("trial_steps", 0)]
        row["trials"] = sum(1 for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s)
        row["seconds"] = found.get("seconds", total)
        row["size"] = module.batch_size
        row["accumulation"] = trainer.accumulate_grad_batches
    else:
        r = tool.result
        row["trials"] = f"{len(r.trials)} + {len(r.sweep)} sweep"
        row["seconds"] = r.seconds
        row["size"] = module.batch_size
        row["accumulation"] = trainer.accumulate_grad_batches
    if row["full_epoch"] == "yes" and "epoch_seconds" in found:
        row["samples_per_s"] = len(data) / found["epoch_seconds"]
    del module, trainer, tool
    gc.collect()
    return row


# -- Hugging Face ------------------------------------------------------------

HF_LENGTH = 64


def hf_rows(args):
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from batchtune.huggingface import tune_training_args

    with batchtune._core.uncounted():
        g = torch.Generator().manual_seed(3)
        data = [{"input_ids": x, "labels": x}
                for x in torch.randint(0, 512, (args.hf_samples, HF_LENGTH), generator=g)]

    def model():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=HF_LENGTH, n_embd=64,
                                          n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0))

    def hf_args(out, **kw):
        return TrainingArguments(output_dir=out, use_cpu=True, report_to="none", save_strategy="no",
                                 logging_strategy="no", per_device_train_batch_size=args.hf_batch,
                                 num_train_epochs=1, learning_rate=5e-4, disable_tqdm=True, **kw)

    class Loops(TrainerCallback):
        def __init__(self):
            self.begins = []

        def on_train_begin(self, a, state, control, **kw):
            self.begins.append(time.perf_counter())

    rows = []
    out = tempfile.mkdtemp(prefix="bt_hf_")
    # auto_find_batch_size: the size search is the training loop, restarted at x 0.9.
    with batchtune.emulated_memory(args.hf_limit):
        m = model()
        loops = Loops()
        trainer = Trainer(model=m, args=hf_args(out, auto_find_batch_size=True), train_dataset=data,
                          callbacks=[loops])
        t0 = time.perf_counter()
        try:
            result = trainer.train()
            full = "yes"
        except torch.OutOfMemoryError:
            result, full = None, "no"
        size = trainer._train_batch_size
        rows.append({"tool": "`TrainingArguments(auto_find_batch_size=True)` (from "
                             f"{args.hf_batch}, x 0.9 per out-of-memory)",
                     "trials": len(loops.begins), "seconds": loops.begins[-1] - t0 if loops.begins else None,
                     "size": size, "accumulation": trainer.args.gradient_accumulation_steps,
                     "full_epoch": full,
                     "samples_per_s": result.metrics["train_samples_per_second"] if result else None,
                     "global_batch": size * trainer.args.gradient_accumulation_steps})
        del trainer, m
        gc.collect()
    with batchtune.emulated_memory(args.hf_limit):
        m = model()
        t0 = time.perf_counter()
        tuned, r = tune_training_args(m, hf_args(out), data, memory_limit=args.hf_limit, report=None,
                                      time_budget=args.time_budget, return_result=True)
        seconds = time.perf_counter() - t0
        trainer = Trainer(model=m, args=tuned, train_dataset=data)
        try:
            result = trainer.train()
            full = "yes"
        except torch.OutOfMemoryError:
            result, full = None, "no"
        rows.append({"tool": "`batchtune.huggingface.tune_training_args` (sweep, throughput, "
                             "10 % margin)",
                     "trials": f"{len(r.trials)} + {len(r.sweep)} sweep", "seconds": seconds,
                     "size": tuned.per_device_train_batch_size,
                     "accumulation": tuned.gradient_accumulation_steps, "full_epoch": full,
                     "samples_per_s": result.metrics["train_samples_per_second"] if result else None,
                     "global_batch": tuned.per_device_train_batch_size * tuned.gradient_accumulation_steps})
        del trainer, m
        gc.collect()
    return rows


def table(rows, hf=False):
    head = "| tool | trials | seconds | size chosen | accumulation | full epoch without OOM | samples/s |"
    rule = "|---|---:|---:|---:|---:|---|---:|"
    if hf:
        head += " effective global batch |"
        rule += "---:|"
    lines = [head, rule]
    for r in rows:
        sps = f"{r['samples_per_s']:.0f}" if r.get("samples_per_s") else "—"
        sec = f"{r['seconds']:.0f}" if r.get("seconds") is not None else "—"
        line = (f"| {r['tool']} | {r['trials']} | {sec} | {r['size']} | {r['accumulation']} | "
                f"{r['full_epoch']} | {sps} |")
        if hf:
            line += f" {r['global_batch']} |"
        lines.append(line)
    return "\n".join(lines)


def main():
    args = parse()
    only = args.only.split(",")
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}
    if "lightning" in only:
        rows = [lightning_row(args, "lightning"), lightning_row(args, "batchtune")]
        report["lightning"] = rows
        print(f"Lightning, {args.samples} sequences, emulated {args.limit}:\n{table(rows)}\n",
              flush=True)
    if "huggingface" in only:
        rows = hf_rows(args)
        report["huggingface"] = rows
        print(f"Hugging Face, GPT-2 from a config, {args.hf_samples} x {HF_LENGTH} tokens, "
              f"emulated {args.hf_limit}, args asking for {args.hf_batch}:\n{table(rows, hf=True)}\n",
              flush=True)
    report["load_average_end"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
