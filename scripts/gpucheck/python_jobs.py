#!/usr/bin/env python3
"""The Python rows' programs: each job runs one path a user of the batchtune
package runs, in a process of its own, and prints what it saw as one JSON
object, the last line of its stdout; `verdicts.py` judges it.

    python_jobs.py tune --device cuda|cpu              batchtune.tune, state and allocator kept
    python_jobs.py probe --device D --batch-size N     batchtune.probe of the tune's workload
    python_jobs.py trainer --device D                  Trainer: bf16, fp16, an out-of-memory mid-step
    python_jobs.py lightning --device D [--adapt-fp16] the Lightning callback
    python_jobs.py hf --device D                       tune_training_args and 20 steps
    python_jobs.py lengths --device D                  tune(lengths=...), TokenBudgetSampler steps
    python_jobs.py compile --device D                  a torch.compile'd model tuned against eager
    python_jobs.py checkpointing --device D            checkpointing="auto": its choice and reason

On "cuda" the sizes are a GPU's (torchvision's ResNet-50 at 3x224x224); on
"cpu" the rehearsal's, the CPU standing in at small sizes under batchtune's
emulated device memory (`SIZES`). Needs torch, torchvision, lightning and
transformers beside batchtune (`PYTHONPATH`/`BATCHTUNE_CORE_DIR`, set by
scripts/gpu-check). Imports nothing of gpucheck: it runs under any python.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch


@dataclass(frozen=True)
class Sizes:
    arch: str          # torchvision's model for tune/probe
    image: int         # its input is 3 x image x image
    limit: str         # the memory limit of the tune and its probes
    amp: str           # their precision
    time_budget: float  # the tune's (its search gets a share): on two shared cores a
                        # search cut short by it answers low, and py-tune-larger fails
    small_image: int   # the Trainer's images (resnet18)
    micro: int         # the Trainer's micro-batch
    steps: int         # the Trainer's steps in each precision
    lightning_arch: str   # Lightning's model and images
    lightning_image: int
    lightning_limit: str
    lightning_target: int
    lightning_steps: int
    hf_limit: str
    hf_length: int
    lm: "LMSizes"      # the transformer of the lengths, compile and checkpointing rows


@dataclass(frozen=True)
class LMSizes:
    vocab: int
    width: int
    heads: int
    layers: int
    longest: int       # py-lengths: the longest sequence (its corpus is ragged below it)
    samples: int       # py-lengths: the corpus's sequences
    length: int        # py-compile, py-checkpointing: every sequence's length
    limit: str         # the memory limit of their tunes (a cap on CUDA, emulated on the CPU)
    amp: str
    time_budget: float  # each tune's (py-checkpointing's "auto": twice, half to each configuration)
    steps: int         # py-lengths: the Trainer's steps by the token budget
    backend: str       # py-compile: torch.compile's backend


SIZES = {
    "cuda": Sizes(arch="resnet50", image=224, limit="3GiB", amp="bf16", time_budget=60,
                  small_image=64, micro=64, steps=10, lightning_arch="resnet18",
                  lightning_image=64, lightning_limit="1GiB",
                  lightning_target=1024, lightning_steps=30, hf_limit="2GiB", hf_length=256,
                  lm=LMSizes(vocab=4096, width=512, heads=8, layers=4, longest=512, samples=2000,
                             length=256, limit="2GiB", amp="bf16", time_budget=15, steps=10,
                             backend="inductor")),
    # Lightning's fits train a small convnet on the CPU: a torchvision model's
    # steps there take seconds on two shared cores, and its tune starts at
    # batch 1, where ResNet's last batch norm at 32x32 sees one value a channel.
    "cpu": Sizes(arch="resnet18", image=32, limit="256MiB", amp="off", time_budget=120,
                 small_image=32, micro=8, steps=3, lightning_arch="convnet",
                 lightning_image=32, lightning_limit="16MiB",
                 lightning_target=64, lightning_steps=20, hf_limit="24MiB", hf_length=16,
                 # aot_eager: traced forward and backward, no code generated (inductor's
                 # C++ kernels take minutes to build on two shared cores).
                 lm=LMSizes(vocab=256, width=64, heads=2, layers=2, longest=96, samples=1000,
                            length=32, limit="24MiB", amp="off", time_budget=40, steps=6,
                            backend="aot_eager")),
}

# Lightning's "16-mixed" runs only on CUDA (on the CPU Lightning takes bf16).
LIGHTNING_PRECISION = {"cuda": ("bf16-mixed", "16-mixed"), "cpu": ("bf16-mixed", "bf16-mixed")}


def emulated(device: str, limit: str):
    """On the CPU the emulated device memory of `limit` (the rehearsal's
    stand-in for a GPU's); on a GPU nothing."""
    import batchtune
    return batchtune.emulated_memory(limit) if device == "cpu" else contextlib.nullcontext()


def image_batches(channels_size: int, classes: int):
    def make_batch(n: int):
        g = torch.Generator().manual_seed(n)
        return (torch.randn(n, 3, channels_size, channels_size, generator=g),
                torch.randint(0, classes, (n,), generator=g))
    return make_batch


def convnet(classes: int) -> torch.nn.Module:
    """The rehearsal's stand-in for a torchvision model where the CPU is too slow for one."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes))


def cross_entropy(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def image_workload(arch: str, image: int, device: str, classes: int = 1000, fused: bool = False):
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None, num_classes=classes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused or None)
    return model, optimizer, image_batches(image, classes)


def state_tensors(model, optimizer) -> List[torch.Tensor]:
    tensors = [t for t in model.state_dict().values() if isinstance(t, torch.Tensor)]
    for state in optimizer.state.values():
        tensors += [t for t in state.values() if isinstance(t, torch.Tensor)]
    return tensors


def allocator_state(device: str) -> Dict[str, Any]:
    if device != "cuda":
        return {"fraction": None, "current_device": None}
    return {"fraction": torch.cuda.get_per_process_memory_fraction(torch.cuda.current_device()),
            "current_device": torch.cuda.current_device()}


def rng_state(device: str) -> torch.Tensor:
    return torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()


# ------------------------------------------------------------------ the jobs


def job_tune(args) -> Dict[str, Any]:
    """batchtune.tune in the middle of a training run: one optimizer step
    taken first (AdamW's state exists), then the search; afterwards the
    parameters, the optimizer's state and the RNG state are what they
    were, bit for bit, and so are the allocator's fraction and the current
    device."""
    import batchtune
    s = SIZES[args.device]
    model, optimizer, make_batch = image_workload(s.arch, s.image, args.device)
    optimizer.zero_grad()
    cross_entropy(model, [t.to(args.device) for t in make_batch(2)]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    before = [t.detach().clone() for t in state_tensors(model, optimizer)]
    rng = rng_state(args.device).clone()
    found = allocator_state(args.device)
    start = time.monotonic()
    result = batchtune.tune(model, optimizer, cross_entropy, make_batch, device=args.device, amp=s.amp,
                            memory_limit=s.limit, strategy="binsearch", sweep=False,
                            time_budget=s.time_budget)
    seconds = time.monotonic() - start
    after = state_tensors(model, optimizer)
    return {"max_batch_size": result.max_batch_size, "complete": result.complete, "reason": result.reason,
            "trials": [[t.batch_size, t.fits, t.failure] for t in result.trials],
            "diagnosis": result.diagnosis, "seconds": seconds, "model": f"{s.arch} 3x{s.image}x{s.image}", "amp": s.amp,
            "memory_limit": s.limit,
            "state_tensors": len(before),
            "state_identical": len(before) == len(after) and all(
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(before, after)),
            "rng_identical": torch.equal(rng, rng_state(args.device)),
            "allocator_before": found, "allocator_after": allocator_state(args.device)}


def job_probe(args) -> Dict[str, Any]:
    """The tune's workload at one batch size, in a fresh process."""
    import batchtune
    s = SIZES[args.device]
    model, optimizer, make_batch = image_workload(s.arch, s.image, args.device)
    r = batchtune.probe(model, optimizer, cross_entropy, make_batch, batch_size=args.batch_size,
                        device=args.device, memory_limit=s.limit, amp=s.amp)
    return {"batch_size": args.batch_size, "fits": r.fits, "failure": r.failure,
            "peak_bytes": r.peak_bytes, "error": (r.error or "")[:300]}


class ForcedOutOfMemory:
    """A loss that, once armed, asks the allocator for more than the device
    has after the forward of a micro-batch larger than `above`: the real
    allocator's refusal (the emulated one on the CPU), in the middle of a
    step whose earlier micro-batches may have run."""

    def __init__(self, device: str, above: int):
        self.device = device
        self.above = above
        self.armed = False
        self.fired = 0

    def __call__(self, model, batch):
        loss = cross_entropy(model, batch)
        if self.armed and batch[0].shape[0] > self.above:
            self.armed = False
            self.fired += 1
            total = (torch.cuda.get_device_properties(0).total_memory if self.device == "cuda" else 1 << 40)
            torch.empty(2 * total, dtype=torch.uint8, device=self.device)
        return loss


def trainer_run(device: str, amp: str, micro: int, accumulation: int, steps: int, image: int,
                loss_fn=cross_entropy, before_step=None) -> Dict[str, Any]:
    import batchtune
    model, optimizer, make_batch = image_workload("resnet18", image, device, classes=10)
    plan = batchtune.Plan.make(micro, target_batch=micro * accumulation, amp=amp, base_lr=1e-3)
    trainer = batchtune.Trainer(model, optimizer, loss_fn, plan)
    start = [p.detach().clone() for p in model.parameters()]
    losses, scales, skipped = [], [], 0
    for i in range(steps):
        if before_step is not None:
            before_step(i)
        scale = trainer.scaler.get_scale() if trainer.scaler is not None else None
        losses.append(trainer.step(make_batch(plan.batch_size)))
        if trainer.scaler is not None:
            scales.append(trainer.scaler.get_scale())
            skipped += scales[-1] < scale  # the scaler halves its scale where it skips the step
    moved = any(not torch.equal(a, p.detach()) for a, p in zip(start, model.parameters()))
    return {"amp": amp, "steps": trainer.steps_done, "losses": losses,
            "finite": all(math.isfinite(x) for x in losses), "parameters_moved": moved,
            "global_batch_size": plan.global_batch_size, "micro_batch_size": trainer.micro_batch_size,
            "plan_micro_batch_size": plan.micro_batch_size, "recoveries": list(trainer.recoveries),
            "loss_scale": scales[-1] if scales else None, "skipped_steps": skipped}


def job_trainer(args) -> Dict[str, Any]:
    """batchtune.Trainer with a plan: bf16 steps; fp16 with its GradScaler
    (a GPU's); an out-of-memory forced in the middle of a step, from which
    the step recovers with the micro-batch halved and the global batch kept."""
    s = SIZES[args.device]
    runs = {"bf16": trainer_run(args.device, "bf16", s.micro, 2, s.steps, s.small_image)}
    if args.device == "cuda":
        runs["fp16"] = trainer_run(args.device, "fp16", s.micro, 2, s.steps, s.small_image)
    forced = ForcedOutOfMemory(args.device, s.micro // 2)

    def arm(step):
        forced.armed = step == 1  # the second step, after one ran at the plan's micro-batch
    with emulated(args.device, "1GiB"):
        runs["oom"] = trainer_run(args.device, "bf16" if args.device == "cuda" else "off", s.micro, 1,
                                  3, s.small_image, loss_fn=forced, before_step=arm)
    runs["oom"]["forced"] = forced.fired
    return runs


def lightning_fit(device: str, precision: str, adapt: bool, fused: bool, steps: int,
                  target: Optional[int]) -> Dict[str, Any]:
    import lightning.pytorch as pl
    import torchvision
    from batchtune.lightning import BatchTune

    s = SIZES[device]
    image, limit = s.lightning_image, s.lightning_limit
    torch.manual_seed(0)
    n = max(4 * (target or 64), 256)
    g = torch.Generator().manual_seed(1)
    # Labels that follow from the images (their channel means, mapped), so
    # the mean gradient stands out of the noise and the noise scale is finite.
    x = torch.randn(n, 3, image, image, generator=g)
    y = (x.mean(dim=(2, 3)) @ torch.randn(3, 10, generator=g)).argmax(1)
    data = torch.utils.data.TensorDataset(x, y)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = (convnet(10) if s.lightning_arch == "convnet" else
                        getattr(torchvision.models, s.lightning_arch)(weights=None, num_classes=10))
            self.batch_size = 16
            self.losses: List[float] = []

        def training_step(self, batch, batch_idx):
            loss = cross_entropy(self.net, batch)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=fused or None)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size, shuffle=True)

    kwargs = dict(adapt=True, adapt_every=5) if adapt else {}
    callback = BatchTune(memory_limit=limit, target_batch=target, time_budget=20 if device == "cuda" else 10,
                         report=None, **kwargs)
    module = Module()
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, precision=precision,
                             max_steps=steps, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                             num_sanity_val_steps=0, callbacks=[callback])
        start = time.monotonic()
        trainer.fit(module)
    plan = callback.plan
    return {"precision": precision, "fused": fused, "global_step": trainer.global_step, "max_steps": steps,
            "seconds": time.monotonic() - start,
            "micro_batch_size": plan.micro_batch_size if plan else None,
            "global_batch_size": plan.global_batch_size if plan else None,
            "max_batch_size": callback.result.max_batch_size if callback.result else None,
            "final_loss": module.losses[-1] if module.losses else None,
            "finite": bool(module.losses) and all(math.isfinite(x) for x in module.losses),
            "noise_scale": callback.noise_scale if adapt else None,
            "schedule": callback.batch_schedule if adapt else []}


def job_lightning(args) -> Dict[str, Any]:
    """The Lightning callback tunes at fit start and the fit trains with its
    plan; with --adapt-fp16, adapt=True under fp16 ("16-mixed") with a
    fused AdamW, which unscales its gradients itself, its noise scale
    against the same fit's with a plain AdamW in bf16."""
    s = SIZES[args.device]
    plain, fp16 = LIGHTNING_PRECISION[args.device]
    if not args.adapt_fp16:
        return lightning_fit(args.device, plain, False, False, 10 if args.device == "cuda" else 4, None)
    return {"fused": lightning_fit(args.device, fp16, True, True, s.lightning_steps, s.lightning_target),
            "reference": lightning_fit(args.device, plain, True, False, s.lightning_steps, s.lightning_target)}


def job_hf(args) -> Dict[str, Any]:
    """A causal LM from a config (no download), tune_training_args on a
    Hugging Face Trainer, then 20 steps with the arguments it returned."""
    import transformers
    from batchtune.huggingface import tune_training_args
    s = SIZES[args.device]
    gpu = args.device == "cuda"
    vocab = 8192 if gpu else 128
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, vocab, (512, s.hf_length), generator=g)]
    with emulated(args.device, s.hf_limit), tempfile.TemporaryDirectory() as out:
        torch.manual_seed(0)
        config = (transformers.GPT2Config(vocab_size=vocab, n_positions=s.hf_length, n_embd=256, n_layer=4,
                                          n_head=4, bos_token_id=0, eos_token_id=0) if gpu else
                  transformers.GPT2Config(vocab_size=vocab, n_positions=s.hf_length, n_embd=32, n_layer=2,
                                          n_head=2, bos_token_id=0, eos_token_id=0))
        model = transformers.GPT2LMHeadModel(config)
        targs = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=64, max_steps=20,
                                               learning_rate=1e-3, report_to="none", save_strategy="no",
                                               logging_strategy="no", use_cpu=not gpu)
        trainer = transformers.Trainer(model=model, args=targs, train_dataset=data)
        start = time.monotonic()
        tuned, result = tune_training_args(trainer, memory_limit=s.hf_limit, time_budget=20 if gpu else 60,
                                           sweep=False, quiet=True, return_result=True, report=None)
        tune_s = time.monotonic() - start
        out_ = transformers.Trainer(model=model, args=tuned, train_dataset=data).train()
    return {"max_batch_size": result.max_batch_size,
            "per_device_train_batch_size": tuned.per_device_train_batch_size,
            "gradient_accumulation_steps": tuned.gradient_accumulation_steps,
            "bf16": bool(tuned.bf16), "fp16": bool(tuned.fp16), "global_batch_size":
            tuned.per_device_train_batch_size * tuned.gradient_accumulation_steps,
            "global_step": out_.global_step, "training_loss": out_.training_loss, "tune_seconds": tune_s,
            "max_steps": 20}


# ------------------------------------------------------------------ a small causal transformer
# (the rows of the paths the other issues added: lengths, compile, checkpointing)


class Block(torch.nn.Module):
    """A pre-norm causal transformer block, attention by
    `scaled_dot_product_attention` (fused on a GPU): what checkpointing
    recomputes."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class CausalLM(torch.nn.Module):
    def __init__(self, lm: LMSizes, longest: int):
        super().__init__()
        self.embed = torch.nn.Embedding(lm.vocab, lm.width)
        self.pos = torch.nn.Embedding(longest, lm.width)
        self.blocks = torch.nn.Sequential(*[Block(lm.width, lm.heads) for _ in range(lm.layers)])
        self.norm = torch.nn.LayerNorm(lm.width)
        self.head = torch.nn.Linear(lm.width, lm.vocab)

    def forward(self, ids):
        h = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.norm(self.blocks(h)))


def causal_lm(device: str, longest: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return CausalLM(SIZES[device].lm, longest).to(device)


def lm_loss(model, batch):
    """A causal LM's per-token mean: labels shifted, padding (-100) ignored."""
    logits = model(batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             labels.reshape(-1), ignore_index=-100)


def label_tokens(batch):
    return (batch["labels"][:, 1:] != -100).sum()


def lm_batch(vocab: int, n: int, length: int):
    ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(n * 7919 + length))
    return {"input_ids": ids, "labels": ids.clone()}


def ragged_corpus(n: int, longest: int, vocab: int, mean: int = 24, shortest: int = 8):
    """Lengths as text has them (exponential around `mean`, most short, the
    first at the longest) and a sample of each: (lengths, samples)."""
    import random
    rng = random.Random(0)
    lengths = [min(longest, max(shortest, int(rng.expovariate(1 / mean)))) for _ in range(n)]
    lengths[0] = longest
    g = torch.Generator().manual_seed(0)
    samples = []
    for length in lengths:
        ids = torch.randint(0, vocab, (length,), generator=g)
        samples.append({"input_ids": ids, "labels": ids.clone()})
    return lengths, samples


@contextlib.contextmanager
def capped(device: str, limit: str):
    """Training under the tune's limit: the emulated device memory on the CPU;
    on a GPU the caching allocator's fraction at the limit (more than the
    tune's own cap, which leaves the context and the reserve out), put back
    after."""
    import batchtune
    if device != "cuda":
        with batchtune.emulated_memory(limit):
            yield
        return
    units = {"GiB": 1 << 30, "MiB": 1 << 20}
    limit_bytes = int(float(limit[:-3]) * units[limit[-3:]])
    index = torch.cuda.current_device()
    before = torch.cuda.get_per_process_memory_fraction(index)
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, limit_bytes / torch.cuda.get_device_properties(index).total_memory), index)
    torch.cuda.reset_peak_memory_stats(index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(before, index)


def peak_allocated(device: str) -> Optional[int]:
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def job_lengths(args) -> Dict[str, Any]:
    """tune(..., lengths=...) of a causal LM over a ragged corpus: the search
    at the longest length, the length phase at shorter ones, a plan with a
    token budget and its length buckets; then `Trainer(loss_items=...)`
    takes steps of the micro-batches `TokenBudgetSampler` cuts by it, under
    the tune's limit, with no out-of-memory."""
    import batchtune
    lm = SIZES[args.device].lm
    lengths, samples = ragged_corpus(lm.samples, lm.longest, lm.vocab, mean=max(24, lm.longest // 5))
    model = causal_lm(args.device, lm.longest)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen: List[int] = []

    def make_batch(n, length):
        seen.append(length)
        return lm_batch(lm.vocab, n, length)

    start = time.monotonic()
    result = batchtune.tune(model, optimizer, lm_loss, make_batch, lengths=lengths, device=args.device,
                            memory_limit=lm.limit, amp=lm.amp, time_budget=lm.time_budget, base_batch=8,
                            sweep=False, report=None)
    tune_s = time.monotonic() - start
    plan = result.plan
    sampler = batchtune.TokenBudgetSampler(lengths, plan, seed=0)
    loader = torch.utils.data.DataLoader(samples, batch_sampler=sampler, collate_fn=batchtune.pad_collate)
    losses, micro, over = [], 0, 0
    asked = min(lm.steps, len(sampler.steps()))  # an epoch of a small corpus may hold fewer
    with capped(args.device, lm.limit):
        trainer = batchtune.Trainer(model, optimizer, lm_loss, plan, loss_items=label_tokens)
        for step in sampler.group(loader):
            micro += len(step)
            over += sum(b["input_ids"].numel() > plan.token_budget for b in step)
            losses.append(trainer.step(micro_batches=step))
            if len(losses) == asked:
                break
        peak = peak_allocated(args.device)
    model_fit = result.memory_model or {}
    return {"longest": lm.longest, "samples": len(lengths), "mean_length": sum(lengths) / len(lengths),
            "seen_lengths": sorted(set(seen)), "token_budget": plan.token_budget,
            "tokens_per_step": plan.tokens_per_step, "length_buckets": plan.length_buckets,
            "max_batch_size": result.max_batch_size, "complete": result.complete,
            "per_token_bytes": model_fit.get("per_token_bytes"), "fit_error": model_fit.get("fit_error"),
            "tune_seconds": tune_s, "steps_asked": asked, "steps": len(losses), "micro_batches": micro,
            "micro_batches_over_budget": over, "losses": losses,
            "finite": bool(losses) and all(math.isfinite(x) for x in losses),
            "recoveries": list(trainer.recoveries), "peak_allocated_bytes": peak, "memory_limit": lm.limit,
            "amp": lm.amp}


def job_compile(args) -> Dict[str, Any]:
    """The causal LM tuned eager, then compiled (`torch.compile`: inductor on
    a GPU, aot_eager on the CPU), each a binsearch to the single sample under
    the same limit: the compiled tune reports its compile seconds apart, few
    graphs compiled inside its trials, a largest batch at least the eager
    one's, and leaves the model's state as it found it."""
    import batchtune
    lm = SIZES[args.device].lm

    def make_batch(n):
        return lm_batch(lm.vocab, n, lm.length)

    def tune(model, optimizer):
        start = time.monotonic()
        r = batchtune.tune(model, optimizer, lm_loss, make_batch, device=args.device, memory_limit=lm.limit,
                           amp=lm.amp, strategy="binsearch", sweep=False, time_budget=lm.time_budget,
                           base_batch=8, report=None)
        return r, time.monotonic() - start

    eager_model = causal_lm(args.device, lm.length)
    eager, eager_s = tune(eager_model, torch.optim.AdamW(eager_model.parameters(), lr=1e-3))
    del eager_model
    model = causal_lm(args.device, lm.length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [t.detach().clone() for t in state_tensors(model, optimizer)]
    compiled, compiled_s = tune(torch.compile(model, backend=lm.backend), optimizer)
    after = state_tensors(model, optimizer)
    record = compiled.to_dict().get("compile") or {}
    return {"backend": lm.backend, "model": f"causal LM {lm.layers}x{lm.width}, {lm.length} tokens",
            "memory_limit": lm.limit, "amp": lm.amp,
            "eager_max_batch_size": eager.max_batch_size, "eager_complete": eager.complete,
            "eager_compile_seconds": eager.compile_seconds, "eager_seconds": eager_s,
            "max_batch_size": compiled.max_batch_size, "complete": compiled.complete,
            "compile_seconds": compiled.compile_seconds, "recompiles": compiled.recompiles,
            "graphs": record.get("graphs"), "seconds": compiled_s,
            "trials": [[t.batch_size, t.fits, t.failure] for t in compiled.trials],
            "state_identical": len(before) == len(after) and all(
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(before, after))}


def job_checkpointing(args) -> Dict[str, Any]:
    """checkpointing="auto" over the causal LM's blocks: a tune without
    activation checkpointing and one with it, each on half the budget; the
    plan keeps it or not and says why in one reason with both largest
    batches, and the model is left recomputing only where it is kept."""
    import batchtune
    lm = SIZES[args.device].lm

    def make_batch(n):
        return lm_batch(lm.vocab, n, lm.length)

    model = causal_lm(args.device, lm.length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = time.monotonic()
    result = batchtune.tune(model, optimizer, lm_loss, make_batch, device=args.device, memory_limit=lm.limit,
                            amp=lm.amp, checkpointing="auto", checkpoint_modules=[Block],
                            time_budget=2 * lm.time_budget, base_batch=8, report=None)
    seconds = time.monotonic() - start
    reasons = [r for r in result.plan.reasons if r.startswith("checkpointing fits ")]
    return {"model": f"causal LM {lm.layers}x{lm.width}, {lm.length} tokens", "memory_limit": lm.limit,
            "amp": lm.amp, "blocks": lm.layers, "checkpointing": result.plan.checkpointing,
            "checkpoint_modules": list(result.plan.checkpoint_modules or []),
            "in_plan_json": "checkpointing" in result.to_dict()["plan"],
            "reason": reasons[0] if reasons else None, "reasons_found": len(reasons),
            "recomputing": sum("forward" in m.__dict__ for m in model.modules() if isinstance(m, Block)),
            "max_batch_size": result.max_batch_size, "chosen_batch_size": result.plan.micro_batch_size,
            "seconds": seconds}


JOBS = {"tune": job_tune, "probe": job_probe, "trainer": job_trainer, "lightning": job_lightning,
        "hf": job_hf, "lengths": job_lengths, "compile": job_compile, "checkpointing": job_checkpointing}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", choices=sorted(JOBS))
    parser.add_argument("--device", choices=sorted(SIZES), required=True)
    parser.add_argument("--batch-size", type=int, default=0)
    parser.add_argument("--adapt-fp16", action="store_true")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("python_jobs: --device cuda without a GPU", file=sys.stderr)
        return 2
    doc = JOBS[args.job](args)
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
