"""batchtune: the batch size and training configuration that fill your
accelerator without running out of memory — measured with your own training
step (your nn.Module, your optimizer, your loss), leaving no trace.

Example::

    import batchtune, torch

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_batch(n):
        return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))

    def loss_fn(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    result = batchtune.tune(model, optimizer, loss_fn, make_batch, memory_limit="256MiB")
    print(result.max_batch_size, result.chosen_batch_size, result.plan)

The C++ core (the same library as the `batchtune` command) searches, sweeps,
chooses, plans, emulates the device memory on the CPU and writes the report.
"""
import os as _os

import torch as _torch  # LibTorch is loaded before the extension that links it

# A development tree: scripts/test points this at the build's _core.
if _os.environ.get("BATCHTUNE_CORE_DIR"):
    __path__.append(_os.environ["BATCHTUNE_CORE_DIR"])

from . import _core
from ._core import Error
from ._estimate import EstimateResult, estimate
from ._memory import emulated_memory
from ._results import ProbeResult, SweepRow, TuneResult
from ._tune import env, probe, tune
from .plan import Plan
from ._adapt import AdaptiveBatchSampler
from .token_sampler import PadCollate, TokenBudgetSampler, pad_collate
from .trainer import Trainer

__version__ = "0.1.0"

# The integrations import Lightning or transformers, which batchtune does not
# need: they load on first use (`batchtune.lightning`, `batchtune.huggingface`).
_INTEGRATIONS = ("lightning", "huggingface")


def __getattr__(name):
    if name in _INTEGRATIONS:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'batchtune' has no attribute '{name}'")

__all__ = [
    "Error",
    "EstimateResult",
    "Plan",
    "ProbeResult",
    "SweepRow",
    "AdaptiveBatchSampler",
    "PadCollate",
    "TokenBudgetSampler",
    "Trainer",
    "TuneResult",
    "emulated_memory",
    "env",
    "estimate",
    "pad_collate",
    "probe",
    "tune",
]
