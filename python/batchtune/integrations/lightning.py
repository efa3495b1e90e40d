"""Lightning's shape with your own make_batch (the callback that tunes on your own
data and sets accumulation and the lr is `batchtune.lightning.BatchTune`): a
callback that sets the LightningModule's batch size at
`on_fit_start`, as Lightning's `BatchSizeFinder` does — but with batchtune's
search (every answer a size that was run with the optimizer step, nothing left
behind) and its choice.

Example::

    from batchtune.integrations.lightning import BatchtuneFinder

    trainer = L.Trainer(callbacks=[BatchtuneFinder(make_batch, loss_fn)])
    trainer.fit(module)          # module.batch_size is set before the data loads
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - lightning is optional
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError:
        Callback = object

from .._tune import tune


def _first_optimizer(configured: Any) -> torch.optim.Optimizer:
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, dict):
        return _first_optimizer(configured["optimizer"])
    if isinstance(configured, (list, tuple)) and configured:
        return _first_optimizer(configured[0])
    raise TypeError("BatchtuneFinder: configure_optimizers() returned no optimizer")


class BatchtuneFinder(Callback):
    """Tunes at `on_fit_start` and writes the size into `batch_arg_name`.

    Args:
        make_batch: `make_batch(n)` → a batch of n samples as the module's
            training_step receives it.
        loss_fn: `loss_fn(module, batch)` → the scalar loss; without it the
            module's `training_step(batch, 0)` (which must not call self.log).
        mode: "max" for the largest that fits, "throughput" for batchtune's
            choice from the sweep.
        tune_kwargs: passed to `batchtune.tune` (memory_limit, margin, ...).
    """

    def __init__(self, make_batch: Callable[[int], Any], loss_fn: Optional[Callable] = None, *,
                 batch_arg_name: str = "batch_size", mode: str = "max", **tune_kwargs: Any):
        super().__init__()
        if mode not in ("max", "throughput"):
            raise ValueError(f"mode: '{mode}' is max or throughput")
        self.make_batch = make_batch
        self.loss_fn = loss_fn
        self.batch_arg_name = batch_arg_name
        self.mode = mode
        self.tune_kwargs = tune_kwargs
        self.result = None

    def on_fit_start(self, trainer, pl_module) -> None:
        optimizer = _first_optimizer(pl_module.configure_optimizers())
        loss_fn = self.loss_fn
        if loss_fn is None:
            def loss_fn(module, batch):
                out = module.training_step(batch, 0)
                return out["loss"] if isinstance(out, dict) else out
        kwargs = dict(self.tune_kwargs)
        kwargs.setdefault("report", None)
        kwargs.setdefault("amp", "off")
        kwargs.setdefault("sweep", self.mode == "throughput")
        kwargs.setdefault("device", pl_module.device)
        self.result = tune(pl_module, optimizer, loss_fn, self.make_batch, **kwargs)
        size = (self.result.max_batch_size if self.mode == "max"
                else self.result.chosen_batch_size)
        if size > 0:
            setattr(pl_module, self.batch_arg_name, size)
            hparams = getattr(pl_module, "hparams", None)
            if hparams is not None and self.batch_arg_name in hparams:
                hparams[self.batch_arg_name] = size
