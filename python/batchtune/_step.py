"""The one training step that trials time and the Trainer trains with: forward
and loss under autocast, backward (scaled for fp16), optimizer step."""
from __future__ import annotations

import contextlib
import numbers
from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from . import _core
from ._data_parallel import average_gradients, local_backward

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _leading_sizes(batch: Any, where: str = "batch") -> Iterator[Tuple[str, int]]:
    """(where, leading dimension) of every tensor in `batch` that has one; a
    0-dim tensor (a per-batch constant, a temperature) has none."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() > 0:
            yield where, batch.shape[0]
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from _leading_sizes(v, f"{where}[{k!r}]")
    elif isinstance(batch, (list, tuple)):
        for i, v in enumerate(batch):
            yield from _leading_sizes(v, f"{where}[{i}]")


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading dimension its tensors share (0-dim
    tensors aside); a batch whose tensors disagree raises `ValueError`."""
    if not isinstance(batch, (torch.Tensor, dict, list, tuple)):
        raise TypeError(f"batch: must be a tensor, a tuple/list or a dict of them, got "
                        f"{type(batch).__name__}")
    sizes = list(_leading_sizes(batch))
    if not sizes:
        raise TypeError("batch: has no tensor with a batch dimension (only 0-dim tensors or "
                        "other values); give the samples as tensors whose first dimension is the batch")
    first_where, n = sizes[0]
    for where, size in sizes[1:]:
        if size != n:
            raise ValueError(f"batch: {first_where} has {n} samples but {where} has {size}; every "
                             "tensor of a batch must have the batch as its first dimension")
    return n


def check_batch(batch: Any, n: int, source: str = "make_batch") -> None:
    """Refuses a batch from `source(n)` that does not hold n samples: the
    leading dimension of every tensor in it (0-dim tensors aside) must be n,
    or a trial would measure another batch than it reports."""
    sizes = list(_leading_sizes(batch))
    if not sizes:
        raise TypeError(f"{source}: {source}({n}) returned {type(batch).__name__} with no tensor "
                        "of a batch dimension; return a tensor, a tuple/list or a dict of tensors "
                        "whose first dimension is n")
    for where, size in sizes:
        if size != n:
            raise _core.Error(f"{source}: {source}({n}) returned {size} samples in {where} (its "
                              f"first dimension); it must return exactly n samples in every tensor")


def slice_batch(batch: Any, begin: int, end: int) -> Any:
    """Samples [begin, end) of every tensor in `batch` (views); a 0-dim tensor
    is the whole batch's and stays as it is."""
    if isinstance(batch, torch.Tensor):
        return batch[begin:end] if batch.dim() > 0 else batch
    if isinstance(batch, dict):
        return type(batch)((k, slice_batch(v, begin, end)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(slice_batch(v, begin, end) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(slice_batch(v, begin, end) for v in batch)
    return batch


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch


def check_amp_device(amp: str, device: torch.device) -> None:
    """Refuses fp16 off CUDA, as `batchtune train --amp fp16` on the CPU is
    refused: where a plan enters training (`Trainer`), `probe` and `tune`. A
    trial's step itself may run fp16 on the CPU (the loss scaler's tests)."""
    if amp == "fp16" and torch.device(device).type != "cuda":
        raise _core.Error("amp: fp16 autocast is for CUDA devices; on the CPU use bf16 or off")


class TrainStep:
    """forward/backward of micro-batches and the optimizer step.

    `amp` is "off", "bf16" or "fp16"; fp16 runs with a `torch.amp.GradScaler`.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 device: torch.device, amp: str = "off",
                 scaler: Optional["torch.amp.GradScaler"] = None):
        if amp not in ("off", "bf16", "fp16"):
            raise _core.Error(f"amp: '{amp}' is not one of off, bf16, fp16")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.device = device
        self.amp = amp
        if amp == "fp16" and scaler is None:
            scaler = torch.amp.GradScaler(device.type)
        self.scaler = scaler
        # Trials ask whether the last optimizer_step was skipped by the scaler
        # (inf/NaN gradients): GradScaler lowers its scale exactly then. Off
        # in training, where reading the scale would wait for the GPU.
        self.track_skips = False
        self.last_step_skipped = False
        # Trials of a DDP model on several ranks: the tune's lockstep with the
        # other ranks (`_core.Lockstep`), met before the gradients are averaged.
        self.lockstep: Optional["_core.Lockstep"] = None

    def autocast(self):
        if self.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])

    def backward(self, batch: Any, weight: float = 1.0) -> torch.Tensor:
        """Forward and backward of one micro-batch, its loss weighted by
        `weight` (its share of the logical batch); returns the unweighted loss.
        A `DistributedDataParallel` model runs it on this rank alone
        (`no_sync`): the gradients are averaged once the ranks agree that the
        step went through (`_data_parallel.average_gradients`)."""
        with local_backward(self.model), self.autocast():
            loss = self.loss_fn(self.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError("loss_fn(model, batch) must return the scalar loss (a 0-dim tensor), "
                            f"got {type(loss).__name__}"
                            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else ""))
        scaled = loss * weight if weight != 1.0 else loss
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        with local_backward(self.model):
            scaled.backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            scale = self.scaler.get_scale() if self.track_skips else None
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if scale is not None:
                self.last_step_skipped = self.scaler.get_scale() < scale
        else:
            self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, batch: Any) -> torch.Tensor:
        """One optimizer step on one batch, as a trial times it; returns its
        loss (0-dim, detached). A DDP model's trials in the tune's lockstep
        meet the other ranks after the backward and average the gradients,
        as `Trainer.step` does; alone (a `probe`), the step is this rank's."""
        self.zero_grad()
        loss = self.backward(batch)
        if self.lockstep is not None:
            if not self.lockstep.check_peers():
                raise torch.OutOfMemoryError("another rank ran out of memory in this step")
            average_gradients(self.model)
        self.optimizer_step()
        return loss


def loss_item_count(count: Any) -> Any:
    """What `loss_items(batch)` returned, checked: a count, as a 0-dim tensor
    (left on its device) or a float. Raises `TypeError` naming loss_items."""
    if isinstance(count, torch.Tensor):
        if count.numel() != 1:
            raise TypeError("loss_items: must return a count (an int or a 0-dim tensor), got a "
                            f"tensor of shape {tuple(count.shape)}")
        return count.reshape(())
    if isinstance(count, bool) or not isinstance(count, numbers.Real):
        raise TypeError(f"loss_items: must return a count (an int or a 0-dim tensor), got "
                        f"{type(count).__name__}")
    return float(count)
