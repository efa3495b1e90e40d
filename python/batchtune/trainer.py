"""The plan in your loop: a small runner that trains with it."""
from __future__ import annotations

import gc
import sys
from typing import Any, List, Optional

import torch

from . import _core, _distributed
from ._memory import oom_count
from ._step import LossFn, TrainStep, batch_size_of, check_amp_device, slice_batch, to_device
from .plan import Plan, group_lr_ratios


class Trainer:
    """Runs a plan in your training loop: each `step(batch)` takes the samples
    of one optimizer step on this process (`plan.batch_size`, i.e. micro-batch
    × accumulation, as `plan.dataloader_kwargs()` loads them), splits them into
    micro-batches, accumulates their gradients with each loss weighted by its
    share of the batch, and steps the optimizer once.

    - The learning rate of every parameter group follows the plan: its
      `lr` (relative to the groups' lrs when the Trainer was made, the first
      group not at lr 0 taking the plan's) with the linear warm-up of
      `warmup_steps`; a group at lr 0 (frozen) stays at 0.
    - `amp` bf16 or fp16 runs the forward under `torch.autocast`; fp16 with a
      `torch.amp.GradScaler`.
    - An out-of-memory in a micro-batch frees what the step held, halves the
      micro-batch and runs the same samples again: the logical batch (and so
      the learning rate) stays. Under `torch.distributed` every rank learns of
      it and halves together. An error that is no `torch.OutOfMemoryError`
      counts when the allocator counted a refusal during the step or its
      message names one ("CUDA error: out of memory").

    This is the step the trials of `batchtune.tune` time.

    Example::

        trainer = batchtune.Trainer(model, optimizer, loss_fn, result.plan)
        loader = DataLoader(dataset, shuffle=True, **result.plan.dataloader_kwargs())
        for batch in loader:
            loss = trainer.step(batch)
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 plan: Plan, *, device: Optional[torch.device] = None, group: Optional[Any] = None,
                 scale_lr: bool = True):
        if plan.micro_batch_size < 1 or plan.accumulation_steps < 1:
            raise _core.Error("plan: micro_batch_size and accumulation_steps must be at least 1")
        self.model = model
        self.optimizer = optimizer
        self.plan = plan
        self.group = group
        if device is None:
            p = next(model.parameters(), None)
            device = p.device if p is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.micro_batch_size = plan.micro_batch_size
        self.steps_done = 0
        self.recoveries: List[str] = []
        self.scale_lr = scale_lr
        # The groups' lrs relative to the first one not at 0: the plan's lr is
        # that group's; a group at lr 0 is frozen and stays at 0.
        self._lr_ratios = group_lr_ratios([float(g["lr"]) for g in optimizer.param_groups])
        check_amp_device(plan.amp, self.device)
        self._step = TrainStep(model, optimizer, loss_fn, self.device, plan.amp)

    @property
    def scaler(self) -> Optional["torch.amp.GradScaler"]:
        return self._step.scaler

    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        return self.plan.lr_at(self.steps_done)

    def _apply_lr(self) -> None:
        if not self.scale_lr:
            return
        lr = self.lr()
        for group, ratio in zip(self.optimizer.param_groups, self._lr_ratios):
            group["lr"] = lr * ratio

    def _accumulate(self, batch: Any, n: int, micro: int) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for begin in range(0, n, micro):
            end = min(begin + micro, n)
            part = slice_batch(batch, begin, end)
            share = (end - begin) / n
            loss = self._step.backward(part, share)
            total += loss.float() * share
            del part, loss
        return total

    def step(self, batch: Any) -> float:
        """One optimizer step over `batch` (any number of samples; normally
        `plan.batch_size`). Returns the batch's mean loss."""
        batch = to_device(batch, self.device, non_blocking=self.plan.pin_memory)
        n = batch_size_of(batch)
        if n < 1:
            raise ValueError("Trainer.step: the batch is empty")
        self._apply_lr()
        while True:
            micro = min(self.micro_batch_size, n)
            oom: Optional[BaseException] = None
            total = None
            self._step.zero_grad()
            ooms_before = oom_count(self.device)
            try:
                total = self._accumulate(batch, n, micro)
            except torch.OutOfMemoryError as e:
                oom = e
            except Exception as e:  # noqa: BLE001 - an out-of-memory under another name?
                # "CUDA error: out of memory" (RuntimeError, AcceleratorError), cuDNN's
                # engine search after the allocator refused its workspace: the
                # allocator's counter or the message decides, as in the trials.
                if _core.classify_failure(str(e), ooms_before, oom_count(self.device)) != "out_of_memory":
                    raise
                oom = e
            failed = _distributed.any_rank(oom is not None, self.group)
            if not failed:
                break
            message = str(oom).split("\n", 1)[0] if oom is not None else "on another rank"
            if oom is not None:
                oom.__traceback__ = None
            del oom, total
            self._step.zero_grad()
            gc.collect()
            if torch.cuda.is_available() and self.device.type == "cuda":
                torch.cuda.empty_cache()
            if micro <= 1:
                raise torch.OutOfMemoryError(
                    f"batchtune.Trainer: out of memory at micro-batch 1, nothing left to halve "
                    f"({message})")
            self.micro_batch_size = max(1, micro // 2)
            note = (f"step {self.steps_done}: out of memory at micro-batch {micro} ({message}); "
                    f"micro-batch {self.micro_batch_size}, the logical batch {n} kept")
            self.recoveries.append(note)
            print(f"batchtune: {note}", file=sys.stderr)
        self._step.optimizer_step()
        self.steps_done += 1
        return float(total)
