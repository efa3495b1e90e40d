"""One trial: the user's step at one batch size, measured, leaving no trace.

The subject (what is trained: model, optimizer, loss, batches) is Python; the
runner that times it, catches the out-of-memory and compares the peak with
the budget is the C++ `TrialRunner` where the extension has it
(`_core.HAS_TRIAL_SUBJECT`), else `run_trial_python`, the same algorithm."""
from __future__ import annotations

import gc
import math
import time
from typing import Any, Callable, Optional

import torch

from . import _core
from ._memory import python_names
from ._snapshot import TrainingSnapshot
from ._step import LossFn, TrainStep, to_device

MakeBatch = Callable[[int], Any]

_SubjectBase = _core.TrialSubject if getattr(_core, "HAS_TRIAL_SUBJECT", False) else object


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0]


class Subject(_SubjectBase):
    """What a trial trains: the user's model, optimizer, loss_fn and make_batch,
    through the same `TrainStep` the `Trainer` uses."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 make_batch: MakeBatch, device: torch.device, amp: str = "off"):
        if _SubjectBase is not object:
            _SubjectBase.__init__(self)
        self.model = model
        self.optimizer = optimizer
        self.make_batch = make_batch
        self.device = device
        self.amp = amp
        self.loss_fn = loss_fn
        self.train_step = TrainStep(model, optimizer, loss_fn, device, amp)
        self.batch = None
        self.snapshot: Optional[TrainingSnapshot] = None
        self.failed = False

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        return f"{type(self.model).__name__} ({n} parameters)"

    def prepare(self, batch_size: int) -> None:
        self.batch = None
        self.batch = to_device(self.make_batch(int(batch_size)), self.device)

    def step(self) -> torch.Tensor:
        return self.train_step(self.batch)

    def save(self) -> None:
        self.snapshot = TrainingSnapshot(self.model, self.optimizer)
        if self.amp == "fp16":  # a fresh loss scale for every trial
            self.train_step.scaler = torch.amp.GradScaler(self.device.type)

    def restore(self) -> None:
        self.batch = None
        self.optimizer.zero_grad(set_to_none=True)
        if self.snapshot is not None:
            self.snapshot.restore()


def _fill_timing(result: "_core.TrialResult") -> None:
    if result.step_seconds:
        result.step_ms = _core.median(result.step_seconds) * 1e3
        result.step_ms_spread = _core.relative_spread(result.step_seconds)
        result.samples_per_s = result.batch_size / (result.step_ms / 1e3)
        total = sum(result.step_seconds)
        waiting = sum(result.wait_seconds)
        result.busy = (total - waiting) / total if total > 0 else 0.0


def run_trial_python(subject: Subject, memory: "_core.DeviceMemory", margin: float,
                     options: "_core.TrialOptions") -> "_core.TrialResult":
    """The C++ `TrialRunner::run` in Python, for an extension without the
    `TrialSubject` seam."""
    if options.batch_size < 1:
        raise _core.Error(f"batch_size: must be at least 1, got {options.batch_size}")
    result = _core.TrialResult()
    result.batch_size = options.batch_size
    result.capacity_bytes = memory.capacity_bytes
    result.usable_bytes = memory.usable_bytes
    result.margin = margin
    subject.save()
    memory.release_cached()
    memory.reset_peak()
    step_seconds, wait_seconds = [], []
    failed_with = None
    try:
        subject.prepare(options.batch_size)
        for i in range(options.warmup_steps + options.steps):
            memory.synchronize()
            start = time.perf_counter()
            loss = subject.step()
            memory.synchronize()
            end = time.perf_counter()
            result.steps_run += 1
            if i == 0:
                first = float(loss)
                if not math.isfinite(first):
                    raise _core.Error(
                        f"trial at batch {options.batch_size}: the loss is {first} after the first "
                        "step; this is not a size limit — check the model, make_batch and the lr")
            if i >= options.warmup_steps:
                step_seconds.append(end - start)
                wait_seconds.append(0.0)
            if i + 1 == options.warmup_steps + options.steps:
                result.loss = float(loss)
            del loss
        result.fits = True
    except torch.OutOfMemoryError as e:
        result.failure = "out_of_memory"
        result.error = _first_line(str(e))
        failed_with = e
    except (RuntimeError, ValueError) as e:
        if isinstance(e, _core.Error) or not _core.is_size_refusal(str(e)):
            _cleanup(subject, memory)
            raise
        result.failure = "does_not_run"
        result.error = _first_line(str(e))
        failed_with = e
    except BaseException:
        # Not a size limit (a shape mismatch, Ctrl-C): the caller stops, and
        # the model is left as it was all the same.
        _cleanup(subject, memory)
        raise
    if failed_with is not None:
        # The traceback holds the frames, and they the step's tensors.
        failed_with.__traceback__ = None
        del failed_with
        subject.optimizer.zero_grad(set_to_none=True)
        subject.batch = None
        gc.collect()
    result.peak_bytes = memory.peak_bytes
    _cleanup(subject, memory)
    result.step_seconds = step_seconds
    result.wait_seconds = wait_seconds
    if result.fits and result.peak_bytes > result.usable_bytes:
        result.fits = False
        result.failure = "over_budget"
        result.error = (f"peak {_core.format_bytes(result.peak_bytes)} is above the usable "
                        f"{_core.format_bytes(result.usable_bytes)} "
                        f"({_core.format_bytes(result.capacity_bytes)} less {margin * 100:.0f} % margin)")
    _fill_timing(result)
    return result


def _cleanup(subject: Subject, memory: "_core.DeviceMemory") -> None:
    subject.restore()
    memory.release_cached()


class Runner:
    """Runs trials of one subject on one device memory with one margin."""

    def __init__(self, subject: Subject, memory: "_core.DeviceMemory", margin: float):
        if not (0 <= margin < 1):
            raise _core.Error(f"margin: must be at least 0 and below 1, got {margin}")
        self.subject = subject
        self.memory = memory
        self.margin = margin
        if getattr(_core, "HAS_TRIAL_SUBJECT", False):
            try:
                self._cpp = _core.TrialRunner(subject, memory, margin)
            except _core.Error as e:
                raise python_names(e) from None
        else:
            self._cpp = None
            memory.set_usable_bytes(int(math.floor(memory.capacity_bytes * (1 - margin))))

    def run(self, options: "_core.TrialOptions") -> "_core.TrialResult":
        if self._cpp is not None:
            try:
                return self._cpp.run(options)
            except _core.Error as e:
                raise python_names(e) from None
            finally:
                # The C++ runner restored the state; the Python side drops what
                # a failed step left referenced.
                self.subject.batch = None
        return run_trial_python(self.subject, self.memory, self.margin, options)
