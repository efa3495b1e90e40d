"""accelerate's shape: `find_executable_batch_size`, as a decorator.

accelerate's own tries 128 and shrinks by 10 % on each out-of-memory *inside
your training function* (with whatever that left behind). This one tunes
first — your step, measured, no trace — and calls your function once with the
largest batch that fits; should it still run out of memory, it goes on as
accelerate does (× 0.9).

Example::

    from batchtune.integrations.accelerate import find_executable_batch_size

    @find_executable_batch_size(model=model, optimizer=opt, loss_fn=loss_fn,
                                make_batch=make_batch)
    def train(batch_size):
        loader = DataLoader(dataset, batch_size=batch_size)
        ...

    train()
"""
from __future__ import annotations

import functools
import gc
from typing import Any, Callable, Optional

import torch

from .._tune import tune


def _should_reduce(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and len(e.args) == 1 and isinstance(e.args[0], str)
        and ("out of memory" in e.args[0] or "DefaultCPUAllocator: can't allocate memory" in e.args[0]))


def find_executable_batch_size(function: Optional[Callable] = None, *, model, optimizer, loss_fn,
                               make_batch, **tune_kwargs: Any):
    """Calls `function(batch_size, *args, **kwargs)` with the largest batch
    `batchtune.tune` found (keyword arguments go to `tune`; by default no
    sweep and no report)."""
    if function is None:
        return functools.partial(find_executable_batch_size, model=model, optimizer=optimizer,
                                 loss_fn=loss_fn, make_batch=make_batch, **tune_kwargs)
    tune_kwargs.setdefault("sweep", False)
    tune_kwargs.setdefault("report", None)
    tune_kwargs.setdefault("amp", "off")

    @functools.wraps(function)
    def decorator(*args, **kwargs):
        result = tune(model, optimizer, loss_fn, make_batch, **tune_kwargs)
        decorator.tune_result = result
        batch_size = result.max_batch_size
        while batch_size > 0:
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - as accelerate: only an out-of-memory retries
                if not _should_reduce(e):
                    raise
                e.__traceback__ = None
                del e
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                batch_size = int(batch_size * 0.9)
        raise RuntimeError("No executable batch size found, reached zero.")

    decorator.tune_result = None
    return decorator
