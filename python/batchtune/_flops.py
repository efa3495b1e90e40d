"""The model's FLOPs a sample, for the sweep rows' achieved FLOP/s and model
FLOPs utilization (MFU): PyTorch's own counter (`torch.utils.flop_counter`)
over one forward of the user's loss at batch 1. The core multiplies by 3 for
a training step (the backward is about twice the forward) and divides by
the GPU's datasheet peak (include/batchtune/monitoring/peak_flops.h)."""
from __future__ import annotations

from typing import Optional

import torch

from ._checkpointing import _inner
from ._sharded import is_sharded
from ._step import LossFn, to_device
from ._trial import MakeBatch


def forward_flops_per_sample(model: torch.nn.Module, loss_fn: LossFn, make_batch: MakeBatch,
                             device: torch.device) -> Optional[float]:
    """The forward's FLOPs (loss included) for one sample, counted on the
    user's module (under DDP's and `torch.compile`'s wrappers) in eval mode
    without gradients, the random generators put back: no trace is left.
    None for a sharded model (its forward gathers across ranks), or where
    the counter cannot run the step (then the rows show no FLOP/s)."""
    from torch.utils.flop_counter import FlopCounterMode

    if is_sharded(model):
        return None
    module = _inner(model)
    was_training = module.training
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        # Eager even where the module compiled itself in place (`model.compile()`):
        # a compile here, at batch 1 in eval mode, would be the compile phase's.
        with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                torch.compiler.set_stance("force_eager"):
            module.eval()
            batch = to_device(make_batch(1), device)
            counter = FlopCounterMode(display=False)
            with counter:
                loss_fn(module, batch)
            flops = float(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - counting is a report's extra, never the tune's failure
        return None
    finally:
        module.train(was_training)
    return flops if flops > 0 else None
