"""The one training step that trials time and the Trainer trains with: forward
and loss under autocast, backward (scaled for fp16), optimizer step."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        for v in batch.values():
            return batch_size_of(v)
    if isinstance(batch, (list, tuple)):
        for v in batch:
            return batch_size_of(v)
    raise TypeError(f"a batch must be a tensor, a tuple/list or a dict of them, got {type(batch).__name__}")


def slice_batch(batch: Any, begin: int, end: int) -> Any:
    """Samples [begin, end) of every tensor in `batch` (views)."""
    if isinstance(batch, torch.Tensor):
        return batch[begin:end]
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


class TrainStep:
    """forward/backward of micro-batches and the optimizer step.

    `amp` is "off", "bf16" or "fp16"; fp16 runs with a `torch.amp.GradScaler`.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 device: torch.device, amp: str = "off",
                 scaler: Optional["torch.amp.GradScaler"] = None):
        if amp not in ("off", "bf16", "fp16"):
            raise ValueError(f"amp: '{amp}' is not one of off, bf16, fp16")
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

    def autocast(self):
        if self.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])

    def backward(self, batch: Any, weight: float = 1.0) -> torch.Tensor:
        """Forward and backward of one micro-batch, its loss weighted by
        `weight` (its share of the logical batch); returns the unweighted loss."""
        with self.autocast():
            loss = self.loss_fn(self.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError("loss_fn(model, batch) must return the scalar loss (a 0-dim tensor), "
                            f"got {type(loss).__name__}"
                            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else ""))
        scaled = loss * weight if weight != 1.0 else loss
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
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
        """One optimizer step on one batch; returns its loss (0-dim, detached)."""
        self.zero_grad()
        loss = self.backward(batch)
        self.optimizer_step()
        return loss
