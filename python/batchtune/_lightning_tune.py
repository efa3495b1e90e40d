"""The tune behind `BatchTune`: your LightningModule's own `training_step`,
the Trainer's optimizer and batches of your train dataloader's data set,
and under DDP one plan the ranks agree on."""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Tuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.parsing import lightning_getattr
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from . import _core
from ._lightning_plan import trainer_amp
from ._lightning_tokens import LongestCut, train_collate
from ._samples import HeaviestFirst
from ._results import TuneResult
from ._tune import tune
from .plan import Plan, reference_lr


def loss_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "loss" in output:
        return output["loss"]
    if output is None:
        raise _core.Error("training_step: returned None (a skipped batch) on a tuning batch; "
                          "batchtune needs its loss: return the loss for every batch")
    raise _core.Error(f"training_step: returned {type(output).__name__}; return the loss tensor "
                      "or a dict with 'loss', as Lightning's automatic optimization needs")


@contextlib.contextmanager
def trial_mode(module: "pl.LightningModule"):
    """The module as the fit loop trains it, for the trials: train mode, and
    `self.log` doing nothing (it needs the fit loop's results; the instance
    attributes shadow the methods and go again afterwards)."""
    def ignore(*_args, **_kwargs):
        return None

    modes = [(m, m.training) for m in module.modules()]
    module.__dict__["log"] = ignore
    module.__dict__["log_dict"] = ignore
    module.train()  # as the fit loop trains it (dropout on)
    try:
        yield
    finally:
        module.__dict__.pop("log", None)
        module.__dict__.pop("log_dict", None)
        for m, training in modes:
            m.training = training


def one_loader(loaders: Any) -> torch.utils.data.DataLoader:
    if isinstance(loaders, torch.utils.data.DataLoader):
        return loaders
    if isinstance(loaders, dict) and len(loaders) == 1:
        return one_loader(next(iter(loaders.values())))
    if isinstance(loaders, (list, tuple)) and len(loaders) == 1:
        return one_loader(loaders[0])
    raise _core.Error(f"train_dataloader(): returned {type(loaders).__name__}; BatchTune tunes with "
                      "one torch.utils.data.DataLoader")


def train_loader(trainer: "pl.Trainer", pl_module: "pl.LightningModule"):
    datamodule = trainer.datamodule
    if datamodule is not None and type(datamodule).train_dataloader is not \
            pl.LightningDataModule.train_dataloader:
        return one_loader(datamodule.train_dataloader())
    return one_loader(pl_module.train_dataloader())


def tune_module(trainer: "pl.Trainer", pl_module: "pl.LightningModule", settings: Any,
                group: Any) -> TuneResult:
    """Tunes `pl_module`'s own `training_step` with the Trainer's optimizer
    as `settings` (the `BatchTune` callback) asks: on batches of the train
    dataloader's data set, heaviest first (by lengths: the longest samples
    cut to each length the tune asks), or `settings.make_batch`, with
    `self.log` doing nothing, measuring this rank's device alone (`group`)
    and planning for the whole job."""
    optimizers = trainer.optimizers
    if len(optimizers) != 1:
        raise _core.Error(f"configure_optimizers: BatchTune tunes with one optimizer, the "
                          f"Trainer has {len(optimizers)}")
    optimizer = optimizers[0]
    if not optimizer.param_groups:
        # Lightning's stand-in (`_MockOptimizer`) when configure_optimizers returned None.
        raise _core.Error(
            "configure_optimizers: returned no optimizer (None), so Lightning trains nothing and "
            "there is no optimizer state to measure; return an optimizer (e.g. "
            "torch.optim.AdamW(self.parameters())) to tune with BatchTune")
    world = trainer.world_size
    rank = trainer.global_rank
    device = pl_module.device
    # Sequences of varying length: every sample's, resolved by the callback.
    lengths = getattr(settings, "sample_lengths", None)
    make_batch = settings.make_batch
    if make_batch is None:
        loader = train_loader(trainer, pl_module)

        def transfer(batch):
            batch = pl_module.on_before_batch_transfer(batch, 0)
            batch = pl_module.transfer_batch_to_device(batch, device, 0)
            return pl_module.on_after_batch_transfer(batch, 0)

        if lengths is not None:
            make_batch = LongestCut(loader.dataset, lengths, train_collate(loader), convert=transfer)
        else:
            make_batch = HeaviestFirst(loader.dataset, loader.collate_fn, convert=transfer,
                                       what="train_dataloader()'s data set")
    loss_fn = settings.loss_fn
    if loss_fn is None:
        takes_index = len(inspect.signature(pl_module.training_step).parameters) >= 2

        def loss_fn(module, batch):
            out = module.training_step(batch, 0) if takes_index else module.training_step(batch)
            return loss_of(out)

    kwargs = dict(settings.tune_kwargs)
    if lengths is not None:
        kwargs["lengths"] = lengths
    size = getattr(make_batch, "size", None)
    if size is not None:
        # A batch larger than this rank's share of the data never occurs.
        share = max(1, size // world)
        kwargs["max_batch"] = min(kwargs.get("max_batch", _core.DEFAULT_MAX_BATCH), share)
    amp = settings.amp if settings.amp is not None else trainer_amp(trainer)
    configured = int(lightning_getattr(pl_module, settings.batch_arg_name))
    base_batch = settings.base_batch or configured * trainer.accumulate_grad_batches * world
    base_lr = settings.base_lr if settings.base_lr is not None else reference_lr(
        [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups])
    # Where the values nobody passed came from, for the reasons.
    sources = {}
    if settings.amp is None:
        sources["amp"] = f"the Trainer's precision '{trainer.precision}'"
    if settings.base_lr is None:
        sources["base_lr"] = "the optimizer's lr"
    rank_zero_info(f"batchtune: tuning {type(pl_module).__name__}.training_step with "
                   f"{type(optimizer).__name__} on {device} ({world} rank(s)), batches from "
                   f"train_dataloader() " + ("by length, the longest samples cut to each"
                                             if lengths is not None else "heaviest first"))
    # The tune plans for the whole job (the target batch over `world`
    # ranks), measuring this rank's device alone (its own group).
    with trial_mode(pl_module):
        result = tune(pl_module, optimizer, loss_fn, make_batch, device=device, amp=amp,
                      objective=settings.objective, memory_limit=settings.memory_limit,
                      margin=settings.margin, time_budget=settings.time_budget,
                      report=settings.report if rank == 0 else None,
                      target_batch=settings.target_batch, world_size=world,
                      base_lr=base_lr, base_batch=base_batch,
                      group=group, _sources=sources, **kwargs)
    return result


def job_plan(trainer: "pl.Trainer", pl_module: "pl.LightningModule",
             result: TuneResult) -> Tuple[Plan, int]:
    """The plan the job trains with, and the largest micro-batch that fits on
    every rank: under DDP the smallest of the ranks' choices, in the plan of
    the first rank that chose it (it planned the job for itself)."""
    world = trainer.world_size
    rank = trainer.global_rank
    own = result.chosen_batch_size
    fits = result.max_batch_size
    if world <= 1:
        if own < 1:
            _none_fits(pl_module, result, "here")
        return result.plan, fits
    root = trainer.strategy.root_device
    job = int(trainer.strategy.reduce(torch.tensor(own, device=root), reduce_op="min").item())
    fits = int(trainer.strategy.reduce(torch.tensor(fits, device=root), reduce_op="min").item())
    if job < 1:
        _none_fits(pl_module, result, "on some rank" if own >= 1 else "here")
    holder = world if own != job else rank
    source = int(trainer.strategy.reduce(torch.tensor(holder, device=root),
                                         reduce_op="min").item())
    plan = result.plan if rank == source else None
    if plan is not None:
        plan.reasons.insert(1, f"micro-batch {job}: the smallest of the {world} ranks' "
                               f"choices (rank {source}'s)")
    return trainer.strategy.broadcast(plan, src=source), fits


def _none_fits(pl_module: "pl.LightningModule", result: TuneResult, where: str) -> None:
    reason = result.diagnosis or (result.trials[0].error if result.trials else "")
    raise _core.Error(f"memory_limit: not even batch 1 of {type(pl_module).__name__} fits "
                      f"{where} ({reason}); give more memory or a smaller model")
