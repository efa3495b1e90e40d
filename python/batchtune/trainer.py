"""The plan in your loop: a small runner that trains with it."""
from __future__ import annotations

import dataclasses
import gc
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from . import _core, _distributed
from ._adapt import Adaptation, adapt_lr_rule, loss_scale_of
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

    - `adapt=True` follows the gradient noise scale as training goes, by the
      policy of `batchtune train --adapt`: every `adapt_every` steps the
      global batch may double or halve where goodput (throughput measured
      here x statistical efficiency) says so, up to `adapt_max_batch`
      (default 32x the plan's) and down to `adapt_min_batch` (default the
      plan's / 32; the plan's own to never go below it), the lr following the plan's scaling rule,
      ramped over 20 steps, applied to the AdaScale gain (`adapt_lr="gain"`,
      the default) or to the batch ratio alone (`adapt_lr="batch"`, as
      `train --adapt-lr batch`). A global batch not yet run is tried for
      one window where it might win; with `adapt_speeds` (samples/s by
      global batch, as a tune measured them with their intervals:
      `result.speed_profile()`) only where the tune's speed ratio, at the
      hopeful end of its interval, says it can, as `train --adapt` after
      its quick tune. The noise scale comes
      from what the step computes anyway (the first micro-batch against the
      whole batch), or, without accumulation, each step against the two
      before it (two copies of the gradients kept).
      Feed it with an `AdaptiveBatchSampler`, which hands out the next
      `plan.batch_size` samples; `batch_schedule` lists the changes, and
      `state_dict()`/`load_state_dict()` carry them over a resume.

    This is the step the trials of `batchtune.tune` time.

    Example::

        trainer = batchtune.Trainer(model, optimizer, loss_fn, result.plan)
        loader = DataLoader(dataset, shuffle=True, **result.plan.dataloader_kwargs())
        for batch in loader:
            loss = trainer.step(batch)
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 plan: Plan, *, device: Optional[torch.device] = None, group: Optional[Any] = None,
                 scale_lr: bool = True, adapt: bool = False,
                 adapt_every: int = _core.DEFAULT_ADAPT_EVERY,
                 adapt_max_batch: Optional[int] = None, adapt_lr: Optional[str] = None,
                 adapt_min_batch: Optional[int] = None,
                 adapt_speeds: Optional[Mapping[int, Any]] = None,
                 clock: Callable[[], float] = time.perf_counter):
        if plan.micro_batch_size < 1 or plan.accumulation_steps < 1:
            raise _core.Error("plan: micro_batch_size and accumulation_steps must be at least 1")
        self.model = model
        self.optimizer = optimizer
        # An adapting run changes its plan as it goes: its own copy.
        self.plan = dataclasses.replace(plan) if adapt else plan
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
        self._adapt: Optional[Adaptation] = None
        lr_rule = adapt_lr_rule(adapt, adapt_lr)
        if adapt_speeds is not None and not adapt:
            raise _core.Error("adapt_speeds: guides adapt; give adapt=True, or leave it out")
        if adapt:
            if not scale_lr:
                raise _core.Error("adapt: moves the lr with the batch, which scale_lr=False "
                                  "turns off; drop one of them")
            self._adapt = Adaptation(self.plan, adapt_every, adapt_max_batch, clock, group,
                                     lr_rule, adapt_min_batch, adapt_speeds)

    @property
    def batch_schedule(self) -> List[Dict[str, Any]]:
        """`adapt=True`: one entry per change of the global batch (the first the
        start): step, global_batch_size, micro_batch_size, accumulation_steps, lr,
        noise_scale, reason. Empty without adapt."""
        return [dict(c) for c in self._adapt.schedule] if self._adapt is not None else []

    @property
    def noise_scale(self) -> Optional[float]:
        """`adapt=True`: the gradient noise scale measured so far (None before)."""
        if self._adapt is None:
            return None
        self._adapt._flush()
        return self._adapt.noise.noise_scale()

    @property
    def scaler(self) -> Optional["torch.amp.GradScaler"]:
        return self._step.scaler

    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        if self._adapt is not None:
            return _core.scheduled_lr(self._adapt.lr_at(self.steps_done, self.plan.lr),
                                      self.plan.warmup_steps, self.steps_done)
        return self.plan.lr_at(self.steps_done)

    def _apply_lr(self) -> None:
        if not self.scale_lr:
            return
        lr = self.lr()
        for group, ratio in zip(self.optimizer.param_groups, self._lr_ratios):
            group["lr"] = lr * ratio

    def _accumulate(self, batch: Any, n: int, micro: int, small: int = 0) -> torch.Tensor:
        """The batch's gradients in micro-batches; with `small` > 0 the first
        `small` samples alone first, their gradient norm measured against the
        whole batch's for the noise scale."""
        total = torch.zeros((), device=self.device)
        bounds = [0, small] if small > 0 else [0]
        bounds += list(range(bounds[-1] + micro, n, micro)) + [n]
        small_sq = None
        for begin, end in zip(bounds, bounds[1:]):
            part = slice_batch(batch, begin, end)
            share = (end - begin) / n
            loss = self._step.backward(part, share)
            total += loss.float() * share
            del part, loss
            if small > 0 and small_sq is None:
                # The gradient so far is share x the first samples' mean gradient.
                small_sq = _core.squared_gradient_norm(list(self.model.parameters())) / share ** 2
        if small_sq is not None:
            scaler = self._step.scaler
            ddp = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
            self._adapt.measure(small, small_sq, n,
                                _core.squared_gradient_norm(list(self.model.parameters())),
                                scaler.get_scale() if scaler is not None else 1.0,
                                _distributed.world_size(self.group) if ddp else 1)
        return total

    def step(self, batch: Any) -> float:
        """One optimizer step over `batch` (any number of samples; normally
        `plan.batch_size`). Returns the batch's mean loss."""
        batch = to_device(batch, self.device, non_blocking=self.plan.pin_memory)
        n = batch_size_of(batch)
        if n < 1:
            raise ValueError("Trainer.step: the batch is empty")
        self._apply_lr()
        small = self._adapt.small_batch(n, min(self.micro_batch_size, n)) \
            if self._adapt is not None else 0
        while True:
            micro = min(self.micro_batch_size, n)
            oom: Optional[BaseException] = None
            total = None
            self._step.zero_grad()
            ooms_before = oom_count(self.device)
            try:
                total = self._accumulate(batch, n, micro, min(small, micro) if small < n else 0)
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
            if self._adapt is not None:
                self._adapt.adapter.cap_micro_batch(self.micro_batch_size)
            note = (f"step {self.steps_done}: out of memory at micro-batch {micro} ({message}); "
                    f"micro-batch {self.micro_batch_size}, the logical batch {n} kept")
            self.recoveries.append(note)
            print(f"batchtune: {note}", file=sys.stderr)
        if self._adapt is not None:
            if micro >= n:  # no accumulation: this step against the previous one
                ddp = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
                self._adapt.measure_successive(
                    list(self.model.parameters()),
                    n * (_distributed.world_size(self.group) if ddp else 1),
                    loss_scale_of(self._step.scaler))
            else:
                self._adapt.successive.reset()
        self._step.optimizer_step()
        self.steps_done += 1
        if self._adapt is not None:
            self._adapt_batch(n)
        return float(total)

    def _adapt_batch(self, n: int) -> None:
        """Counts the step's samples and, every `adapt_every` steps, decides."""
        self._adapt.trained(n * _distributed.world_size(self.group), self.device)
        if self.steps_done % self._adapt.every != 0:
            return
        change = self._adapt.decide(self.steps_done, self.plan, self.device)
        if change is None:
            return
        lr_now = self._adapt.lr_at(self.steps_done, self.plan.lr)
        before = self.plan.global_batch_size
        self.plan.global_batch_size = change["global_batch_size"]
        self.plan.micro_batch_size = change["micro_batch_size"]
        self.plan.accumulation_steps = change["accumulation_steps"]
        self.plan.lr = change["lr"]
        self.micro_batch_size = change["micro_batch_size"]
        self._adapt.apply(change, self.steps_done, lr_now)
        if _distributed.rank(self.group) == 0:
            print(f"batchtune: step {self.steps_done}: global batch {before} -> "
                  f"{change['global_batch_size']}, lr {change['lr']:.3g}: {change['reason']}",
                  file=sys.stderr)

    def state_dict(self) -> Dict[str, Any]:
        """Where the run stands, for a checkpoint beside the model's and the
        optimizer's: the steps, the micro-batch an out-of-memory left, and with
        adapt the plan as it stands and the schedule."""
        state: Dict[str, Any] = dict(steps_done=self.steps_done,
                                     micro_batch_size=self.micro_batch_size)
        if self._adapt is not None:
            state["plan"] = {k: getattr(self.plan, k) for k in (
                "global_batch_size", "micro_batch_size", "accumulation_steps", "lr")}
            state["adapt"] = self._adapt.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if ("adapt" in state) != (self._adapt is not None):
            raise _core.Error("state_dict: it was saved by a Trainer "
                              f"{'with' if 'adapt' in state else 'without'} adapt=True; "
                              "load it into one made the same way")
        self.steps_done = int(state["steps_done"])
        self.micro_batch_size = int(state["micro_batch_size"])
        if self._adapt is not None:
            for k, v in state["plan"].items():
                setattr(self.plan, k, v)
            self._adapt.load_state_dict(state["adapt"])
