"""One trial: the user's step at one batch size, measured, leaving no trace.

The subject (what is trained: model, optimizer, loss, batches) is Python; the
runner that times it, catches the out-of-memory and compares the peak with
the budget is the C++ `TrialRunner` (the one `batchtune probe` runs), and
`tune` is the library's pipeline over that runner."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from . import _core, _distributed
from ._compile import is_compiled, mark_dynamic
from ._data_parallel import ddp_of
from ._sharded import PeerMeetings, is_sharded
from ._sharded import reset as reset_sharded
from ._snapshot import TrainingSnapshot
from ._step import LossFn, TrainStep, check_batch, to_device

MakeBatch = Callable[..., Any]


class Subject(_core.TrialSubject):
    """What a trial trains: the user's model, optimizer, loss_fn and make_batch,
    through the same `TrainStep` the `Trainer` uses."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 make_batch: MakeBatch, device: torch.device, amp: str = "off",
                 longest: int = 0):
        _core.TrialSubject.__init__(self)
        # Sequences: make_batch(n, length), by default at the longest length.
        self.longest = longest
        self.length = 0
        self.model = model
        self.optimizer = optimizer
        self.make_batch = make_batch
        self.device = device
        self.amp = amp
        self.loss_fn = loss_fn
        # A compiled model: the batch dimension (and the length) dynamic, so
        # one graph serves every batch size the tune tries.
        self.dynamic_dims = ((0, 1) if longest else (0,)) if is_compiled(model) else ()
        self.train_step = TrainStep(model, optimizer, loss_fn, device, amp)
        self.train_step.track_skips = True
        self.batch = None
        self.snapshot: Optional[TrainingSnapshot] = None
        self.meetings: Optional[PeerMeetings] = None  # an FSDP2 model's, in lockstep
        self.failed = False
        self.forward_only = False
        # fp16: the loss scale the next trial starts from, the last trial's
        # (a new GradScaler at 2^16 would overflow and skip the first steps
        # of every trial: no optimizer state, no update timed).
        self.loss_scale: Optional[float] = None

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        return f"{type(self.model).__name__} ({n} parameters)"

    def prepare(self, batch_size: int) -> None:
        self.batch = None
        n = int(batch_size)
        batch = self.make_batch(n, self.sequence_length()) if self.longest else self.make_batch(n)
        # A batch of another size would be measured as n samples.
        check_batch(batch, n)
        self.batch = to_device(batch, self.device)
        mark_dynamic(self.batch, self.dynamic_dims)

    def set_sequence_length(self, length: int) -> None:
        if length and not self.longest:
            raise _core.Error("lengths: a trial at a sequence length needs tune(..., lengths=...)")
        self.length = int(length)

    def sequence_length(self) -> int:
        """Tokens per sample of the next batches: the length asked for, else
        the longest (0 without lengths)."""
        return self.length or self.longest

    def step(self) -> torch.Tensor:
        if not self.forward_only:
            return self.train_step(self.batch)
        # Evaluation: forward and loss only, in eval mode, nothing kept for
        # a backward pass.
        self.model.eval()
        with torch.no_grad(), self.train_step.autocast():
            return self.loss_fn(self.model, self.batch).detach()

    def communicates(self) -> bool:
        """A DDP model on several ranks (its step averages the gradients) or an
        FSDP2 one (it gathers and reduce-scatters): the ranks run their
        trials in lockstep."""
        ddp = ddp_of(self.model)
        if ddp is not None:
            return _distributed.active(ddp.process_group)
        return is_sharded(self.model) and _distributed.active()

    def set_lockstep(self, lockstep: Optional["_core.Lockstep"]) -> None:
        self.train_step.lockstep = lockstep
        if self.meetings is not None:
            self.meetings.remove()
            self.meetings = None
        if lockstep is not None and is_sharded(self.model):
            self.meetings = PeerMeetings(self.model, lockstep)

    def set_forward_only(self, on: bool) -> bool:
        self.forward_only = bool(on)
        return True

    def save(self) -> None:
        self.was_training = self.model.training
        self.snapshot = TrainingSnapshot(self.model, self.optimizer)
        if self.amp == "fp16":  # a fresh scaler for every trial, at the last trial's scale
            kwargs = {} if self.loss_scale is None else {"init_scale": self.loss_scale}
            self.train_step.scaler = torch.amp.GradScaler(self.device.type, **kwargs)
            self.train_step.last_step_skipped = False

    def last_step_skipped(self) -> bool:
        return bool(self.train_step.last_step_skipped) and not self.forward_only

    def restore(self) -> None:
        self.batch = None
        scaler = self.train_step.scaler
        if scaler is not None and not self.forward_only:
            self.loss_scale = float(scaler.get_scale())
        if self.forward_only:
            self.model.train(self.was_training)
        self.optimizer.zero_grad(set_to_none=True)
        reset_sharded(self.model)  # a step stopped halfway leaves FSDP2 mid-step
        if self.snapshot is not None:
            self.snapshot.restore()


class Runner:
    """Runs trials of one subject on one device memory with one margin (the
    C++ `TrialRunner`)."""

    def __init__(self, subject: Subject, memory: "_core.DeviceMemory", margin: float):
        if not (0 <= margin <= _core.MAX_MARGIN):
            raise _core.Error(f"margin: must be from 0 to {_core.MAX_MARGIN:g} (the share of "
                              f"memory kept free), got {margin}")
        self.subject = subject
        self.memory = memory
        self.margin = margin
        self._cpp = _core.TrialRunner(subject, memory, margin)

    def run(self, options: "_core.TrialOptions") -> "_core.TrialResult":
        try:
            return self._cpp.run(options)
        finally:
            # The C++ runner restored the state; the Python side drops what
            # a failed step left referenced.
            self.subject.batch = None
