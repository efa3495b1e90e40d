#!/usr/bin/env python3
"""The Python rows' programs: each job runs one path a user of the batchtune
package runs, in a process of its own, and prints what it saw as one JSON
object, the last line of its stdout; `verdicts.py` judges it.

    python_jobs.py tune --device cuda|cpu              batchtune.tune, state and allocator kept
    python_jobs.py probe --device D --batch-size N     batchtune.probe of the tune's workload
    python_jobs.py trainer --device D                  Trainer: bf16, fp16, an out-of-memory mid-step
    python_jobs.py lightning --device D [--adapt-fp16] the Lightning callback
    python_jobs.py hf --device D                       tune_training_args and 20 steps

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


SIZES = {
    "cuda": Sizes(arch="resnet50", image=224, limit="3GiB", amp="bf16", time_budget=60,
                  small_image=64, micro=64, steps=10, lightning_arch="resnet18",
                  lightning_image=64, lightning_limit="1GiB",
                  lightning_target=1024, lightning_steps=30, hf_limit="2GiB", hf_length=256),
    # Lightning's fits train a small convnet on the CPU: a torchvision model's
    # steps there take seconds on two shared cores, and its tune starts at
    # batch 1, where ResNet's last batch norm at 32x32 sees one value a channel.
    "cpu": Sizes(arch="resnet18", image=32, limit="256MiB", amp="off", time_budget=120,
                 small_image=32, micro=8, steps=3, lightning_arch="convnet",
                 lightning_image=32, lightning_limit="16MiB",
                 lightning_target=64, lightning_steps=20, hf_limit="24MiB", hf_length=16),
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


JOBS = {"tune": job_tune, "probe": job_probe, "trainer": job_trainer, "lightning": job_lightning,
        "hf": job_hf}


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
