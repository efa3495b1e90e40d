"""The earlier name of `batchtune.lightning.BatchTune` with your own `make_batch`:
`BatchtuneFinder(make_batch, loss_fn)` is `BatchTune(make_batch=..., loss_fn=...,
scale_lr=False)`, one callback with one `amp` default (the Trainer's precision).

Example::

    from batchtune.lightning import BatchTune

    trainer = L.Trainer(callbacks=[BatchTune(make_batch=make_batch, loss_fn=loss_fn)])
    trainer.fit(module)          # module.batch_size is set before the data loads
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..lightning import BatchTune


class BatchtuneFinder(BatchTune):
    """`BatchTune` over `make_batch(n)` and `loss_fn(module, batch)`, the
    learning rate left alone; `mode` "max" (the largest that fits, no sweep)
    or "throughput" (the sweep's choice)."""

    def __init__(self, make_batch: Callable[[int], Any], loss_fn: Optional[Callable] = None, *,
                 batch_arg_name: str = "batch_size", mode: str = "max", **tune_kwargs: Any):
        if mode not in ("max", "throughput"):
            raise ValueError(f"mode: '{mode}' is max or throughput")
        tune_kwargs.setdefault("sweep", mode == "throughput")
        tune_kwargs.setdefault("scale_lr", False)
        super().__init__(make_batch=make_batch, loss_fn=loss_fn, batch_arg_name=batch_arg_name,
                         **tune_kwargs)
