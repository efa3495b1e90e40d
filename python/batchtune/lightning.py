"""batchtune in Lightning: the `BatchTune` callback.

Where Lightning's `BatchSizeFinder` sits (`on_fit_start`, the module's or the
datamodule's `batch_size`), but tuned with your LightningModule's own
`training_step`, the Trainer's own optimizer and batches of your own train
dataloader (the heaviest samples first), leaving no trace; then the
accumulation that reaches your target global batch, the learning rate the
plan scales to it, and under DDP one plan for every rank.

Example::

    import lightning.pytorch as L
    from batchtune.lightning import BatchTune

    trainer = L.Trainer(accelerator="cpu", max_epochs=1,
                        callbacks=[BatchTune(target_batch=256, memory_limit="256MiB")])
    trainer.fit(module)     # module.batch_size, trainer.accumulate_grad_batches set first

Needs Lightning (`pip install lightning`); `import batchtune` does not.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any, Callable, Dict, Optional

import torch

from . import _checks, _core
from ._fit import missing
from ._samples import HeaviestFirst
from ._tune import TuneResult, tune
from .plan import Plan, group_lr_ratios, reference_lr

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
    from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
    from lightning.pytorch.utilities.rank_zero import rank_zero_info
except ImportError as _error:  # Lightning is optional
    raise missing("batchtune.lightning", "Lightning", "lightning", _error) from None

log = logging.getLogger("batchtune.lightning")

# Lightning's precision flags and the amp of batchtune's trials.
_AMP_OF_PRECISION = {"bf16-mixed": "bf16", "16-mixed": "fp16"}
_PRECISION_OF_AMP = {"bf16": "bf16-mixed", "fp16": "16-mixed"}


def trainer_amp(trainer: "pl.Trainer") -> str:
    """The amp that the Trainer's precision runs: bf16/fp16 for the mixed
    precisions, off otherwise (a "-true" precision converts the module itself,
    and the trials run that module as it is)."""
    return _AMP_OF_PRECISION.get(str(trainer.precision), "off")


def _loss_of(output: Any) -> torch.Tensor:
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
def _trial_mode(module: "pl.LightningModule"):
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


def _one_loader(loaders: Any) -> torch.utils.data.DataLoader:
    if isinstance(loaders, torch.utils.data.DataLoader):
        return loaders
    if isinstance(loaders, dict) and len(loaders) == 1:
        return _one_loader(next(iter(loaders.values())))
    if isinstance(loaders, (list, tuple)) and len(loaders) == 1:
        return _one_loader(loaders[0])
    raise _core.Error(f"train_dataloader(): returned {type(loaders).__name__}; BatchTune tunes with "
                      "one torch.utils.data.DataLoader")


def _switchable(trainer: "pl.Trainer", amp: str) -> bool:
    """Whether the callback can switch the Trainer to `amp`: from "32-true" to
    a mixed precision only (the trials ran at fp32, so the size still fits)."""
    return str(trainer.precision) in ("32-true", "32") and amp in _PRECISION_OF_AMP


def _amp_mismatch(trainer: "pl.Trainer", what: str) -> Exception:
    return _core.Error(f"amp: {what} is not the Trainer's precision '{trainer.precision}'; pass "
                       "Trainer(precision=...) to match, or leave amp unset (the Trainer's)")


class BatchTune(Callback):
    """Tunes when `fit` starts and trains with the plan.

    At `on_fit_start` (the model on its device, the Trainer's optimizer made):

    1. tunes (`batchtune.tune`) the module's `training_step` — its loss, the
       Trainer's optimizer and its state — on batches collated from the train
       dataloader's data set, the heaviest samples first, as large as each
       trial asks; model, optimizer, random generators are left bit-identical
       and `self.log` does nothing during the trials;
    2. the tune itself plans for the job (`target_batch` over every rank);
       under DDP every rank tunes its own device and the ranks take the
       smallest choice (`trainer.strategy.reduce`, min): the plan of the
       first rank that chose it goes to every rank (`trainer.strategy.broadcast`);
    3. sets the micro-batch where Lightning's `BatchSizeFinder` does
       (`batch_arg_name` on the module, its hparams or the datamodule) and has
       the loaders made again with it, sets `trainer.accumulate_grad_batches`
       to reach `target_batch` (micro-batch × accumulation × ranks), scales the
       learning rate as the plan says — every parameter group, keeping their
       ratios, with a linear warm-up (a step-wise LambdaLR) when the plan has
       one — or, when `configure_optimizers` returned a scheduler, says the
       plan's lr and leaves the scheduler's;
    4. logs what it chose and why, and writes the report where `report` names a file (rank 0).

    Args:
        objective, margin, time_budget, report, memory_limit: as
            `batchtune.tune` (`memory_limit` is the CPU's emulated device).
        amp: None (default): the Trainer's precision ("bf16-mixed" → bf16);
            "auto", "off", "bf16", "fp16" as `batchtune.tune`; a plan in
            mixed precision on a "32-true" Trainer switches it to the mixed
            precision (measured at fp32, so the size still fits).
        target_batch: the global batch (all ranks) to reach by accumulation;
            None: no accumulation. The micro-batch may go down to half of the
            chosen one to reach it exactly.
        batch_arg_name: the attribute that sets the dataloaders' batch size.
        scale_lr: False leaves the learning rate alone (the plan still says).
        base_lr, base_batch: the lr known to work and its global batch
            (default: the optimizer's lr at the configured `batch_size` ×
            `accumulate_grad_batches` × ranks).
        make_batch, loss_fn: your own `make_batch(n)` (a batch of n samples
            as `training_step` receives it) and `loss_fn(module, batch)` (the
            scalar loss); None: batches of the train dataloader's data set,
            heaviest first, and the module's `training_step`.
        tune_kwargs: more `batchtune.tune` options (`max_batch`, `tolerance`,
            `lr_scaling`, `warmup_steps`, `strategy`, `verbose`, ...).

    After fit starts: `result` (this rank's `TuneResult`) and `plan`. The plan
    is kept in checkpoints: a resumed fit trains with it without tuning again.
    """

    def __init__(self, *, objective: str = "throughput", amp: Optional[str] = None,
                 target_batch: Optional[int] = None, margin: float = _core.DEFAULT_MARGIN,
                 time_budget: float = _core.DEFAULT_TIME_BUDGET, report: Optional[str] = None,
                 memory_limit=None, batch_arg_name: str = "batch_size", scale_lr: bool = True,
                 base_lr: Optional[float] = None, base_batch: Optional[int] = None,
                 make_batch: Optional[Callable[[int], Any]] = None,
                 loss_fn: Optional[Callable] = None, **tune_kwargs: Any):
        super().__init__()
        if amp is not None and amp not in ("auto", "off", "bf16", "fp16"):
            raise _core.Error(f"amp: '{amp}' is not one of None (the Trainer's precision), auto, "
                              "off, bf16, fp16")
        if target_batch is not None and target_batch < 1:
            raise _core.Error(f"target_batch: must be at least 1, got {target_batch}")
        for reserved in ("group", "device", "target_batch", "base_lr", "base_batch", "world_size"):
            if reserved in tune_kwargs:
                raise _core.Error(f"{reserved}: BatchTune sets it from the Trainer; leave it out")
        # A report path that cannot be written fails now, not after the tune.
        _checks.output_path("report", report)
        self.objective = objective
        self.amp = amp
        self.target_batch = target_batch
        self.margin = margin
        self.time_budget = time_budget
        self.report = report
        self.memory_limit = memory_limit
        self.batch_arg_name = batch_arg_name
        self.scale_lr = scale_lr
        self.base_lr = base_lr
        self.base_batch = base_batch
        self.make_batch = make_batch
        self.loss_fn = loss_fn
        self.tune_kwargs = tune_kwargs
        self.result: Optional[TuneResult] = None
        self.plan: Optional[Plan] = None
        self._group = None
        self._restored: Optional[Plan] = None

    # -- Lightning hooks ---------------------------------------------------

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
              stage: Optional[str] = None) -> None:
        if stage != "fit":
            return
        if not lightning_hasattr(pl_module, self.batch_arg_name):
            raise _core.Error(
                f"batch_arg_name: no '{self.batch_arg_name}' on the LightningModule, its hparams or "
                f"the datamodule, so BatchTune cannot set the batch size; add "
                f"`self.{self.batch_arg_name} = ...` and use it in train_dataloader() "
                "(or pass batch_arg_name=)")
        source = getattr(trainer.fit_loop, "_data_source", None)
        if source is not None and not source.is_module():
            raise _core.Error(
                "train_dataloaders: a loader passed to fit() keeps its batch size; return it from "
                "the LightningModule's or the LightningDataModule's train_dataloader() using "
                f"self.{self.batch_arg_name}")
        if not pl_module.automatic_optimization:
            raise _core.Error("automatic_optimization: BatchTune times Lightning's automatic "
                              "optimization (training_step returns the loss); with manual "
                              "optimization use batchtune.tune on your own step")
        if self.amp in ("off", "bf16", "fp16") and self.amp != trainer_amp(trainer) and \
                not _switchable(trainer, self.amp):
            raise _amp_mismatch(trainer, f"'{self.amp}'")
        if self.target_batch is not None and any(
                isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
            raise _core.Error("target_batch: a GradientAccumulationScheduler callback sets the "
                              "accumulation; remove it or leave target_batch unset")

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        plan = self._restored
        if plan is None:
            plan = self._tune(trainer, pl_module)
        self.plan = plan
        self._apply(trainer, pl_module, plan, resumed=self._restored is not None)

    def state_dict(self) -> Dict[str, Any]:
        return {"plan": self.plan.to_dict()} if self.plan is not None else {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if state_dict.get("plan"):
            self._restored = Plan(**state_dict["plan"])

    # -- the tune ----------------------------------------------------------

    def _local_group(self, trainer: "pl.Trainer"):
        """A process group of this rank alone, so that `tune` measures this
        rank's device only; the ranks agree afterwards through the strategy."""
        import torch.distributed as dist

        if trainer.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        if self._group is None:
            self._group, _ = dist.new_subgroups(group_size=1)
        return self._group

    def _train_loader(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule"):
        datamodule = trainer.datamodule
        if datamodule is not None and type(datamodule).train_dataloader is not \
                pl.LightningDataModule.train_dataloader:
            return _one_loader(datamodule.train_dataloader())
        return _one_loader(pl_module.train_dataloader())

    def _tune(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> Plan:
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
        make_batch = self.make_batch
        if make_batch is None:
            loader = self._train_loader(trainer, pl_module)

            def transfer(batch):
                batch = pl_module.on_before_batch_transfer(batch, 0)
                batch = pl_module.transfer_batch_to_device(batch, device, 0)
                return pl_module.on_after_batch_transfer(batch, 0)

            make_batch = HeaviestFirst(loader.dataset, loader.collate_fn, convert=transfer,
                                       what="train_dataloader()'s data set")
        loss_fn = self.loss_fn
        if loss_fn is None:
            takes_index = len(inspect.signature(pl_module.training_step).parameters) >= 2

            def loss_fn(module, batch):
                out = module.training_step(batch, 0) if takes_index else module.training_step(batch)
                return _loss_of(out)

        kwargs = dict(self.tune_kwargs)
        size = getattr(make_batch, "size", None)
        if size is not None:
            # A batch larger than this rank's share of the data never occurs.
            share = max(1, size // world)
            kwargs["max_batch"] = min(kwargs.get("max_batch", _core.DEFAULT_MAX_BATCH), share)
        amp = self.amp if self.amp is not None else trainer_amp(trainer)
        configured = int(lightning_getattr(pl_module, self.batch_arg_name))
        base_batch = self.base_batch or configured * trainer.accumulate_grad_batches * world
        base_lr = self.base_lr if self.base_lr is not None else reference_lr(
            [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups])
        # Where the values nobody passed came from, for the reasons.
        sources = {}
        if self.amp is None:
            sources["amp"] = f"the Trainer's precision '{trainer.precision}'"
        if self.base_lr is None:
            sources["base_lr"] = "the optimizer's lr"
        rank_zero_info(f"batchtune: tuning {type(pl_module).__name__}.training_step with "
                       f"{type(optimizer).__name__} on {device} ({world} rank(s)), batches from "
                       f"train_dataloader() heaviest first")
        # The tune plans for the whole job (the target batch over `world`
        # ranks), measuring this rank's device alone (its own group).
        with _trial_mode(pl_module):
            result = tune(pl_module, optimizer, loss_fn, make_batch, device=device, amp=amp,
                          objective=self.objective, memory_limit=self.memory_limit,
                          margin=self.margin, time_budget=self.time_budget,
                          report=self.report if rank == 0 else None,
                          target_batch=self.target_batch, world_size=world,
                          base_lr=base_lr, base_batch=base_batch,
                          group=self._local_group(trainer), _sources=sources, **kwargs)
        self.result = result
        if not result.complete:
            raise KeyboardInterrupt
        own = result.chosen_batch_size
        if world <= 1:
            if own < 1:
                self._none_fits(pl_module, result, "here")
            return result.plan
        # The job trains at the smallest of the ranks' choices: the plan of
        # the first rank that chose it, which planned the job for itself.
        root = trainer.strategy.root_device
        job = int(trainer.strategy.reduce(torch.tensor(own, device=root), reduce_op="min").item())
        if job < 1:
            self._none_fits(pl_module, result, "on some rank" if own >= 1 else "here")
        holder = world if own != job else rank
        source = int(trainer.strategy.reduce(torch.tensor(holder, device=root),
                                             reduce_op="min").item())
        plan = result.plan if rank == source else None
        if plan is not None:
            plan.reasons.insert(1, f"micro-batch {job}: the smallest of the {world} ranks' "
                                   f"choices (rank {source}'s)")
        return trainer.strategy.broadcast(plan, src=source)

    @staticmethod
    def _none_fits(pl_module: "pl.LightningModule", result: TuneResult, where: str) -> None:
        reason = result.diagnosis or (result.trials[0].error if result.trials else "")
        raise _core.Error(f"memory_limit: not even batch 1 of {type(pl_module).__name__} fits "
                          f"{where} ({reason}); give more memory or a smaller model")

    # -- applying the plan -------------------------------------------------

    def _apply(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", plan: Plan,
               resumed: bool) -> None:
        said = []
        lightning_setattr(pl_module, self.batch_arg_name, plan.micro_batch_size)
        trainer.accumulate_grad_batches = plan.accumulation_steps
        said.append(f"{self.batch_arg_name} {plan.micro_batch_size}, accumulate_grad_batches "
                    f"{plan.accumulation_steps}, global batch {plan.global_batch_size}")
        self._apply_precision(trainer, plan, said)
        self._apply_lr(trainer, plan, said)
        # The loaders are made (again) with the new batch size.
        fit_loop = trainer.fit_loop
        if hasattr(fit_loop, "_combined_loader"):
            fit_loop._combined_loader = None
            val_loop = getattr(fit_loop.epoch_loop, "val_loop", None)
            if val_loop is not None and hasattr(val_loop, "_combined_loader"):
                val_loop._combined_loader = None
        head = "batchtune: resumed with the checkpoint's plan: " if resumed else "batchtune: "
        rank_zero_info(head + "; ".join(said))
        for reason in plan.reasons:
            rank_zero_info(f"batchtune:   {reason}")
        if self.result is not None and self.result.report:
            rank_zero_info(f"batchtune: report {self.result.report}")
        if trainer.logger is not None and not resumed:
            try:
                trainer.logger.log_hyperparams({
                    "batchtune/micro_batch_size": plan.micro_batch_size,
                    "batchtune/accumulation_steps": plan.accumulation_steps,
                    "batchtune/global_batch_size": plan.global_batch_size,
                    "batchtune/lr": plan.lr, "batchtune/warmup_steps": plan.warmup_steps,
                    "batchtune/amp": plan.amp})
            except Exception as e:  # noqa: BLE001 - a logger's refusal must not stop the fit
                log.warning("batchtune: the logger did not take the plan (%s)", e)

    def _apply_precision(self, trainer: "pl.Trainer", plan: Plan, said) -> None:
        if plan.amp == trainer_amp(trainer):
            return
        if _switchable(trainer, plan.amp):
            from lightning.pytorch.plugins.precision import MixedPrecision

            precision = _PRECISION_OF_AMP[plan.amp]
            trainer.strategy.precision_plugin = MixedPrecision(
                precision, device=trainer.strategy.root_device.type)
            said.append(f"precision {precision} (was 32-true)")
            return
        raise _amp_mismatch(trainer, f"the plan's {plan.amp}")

    def _apply_lr(self, trainer: "pl.Trainer", plan: Plan, said) -> None:
        optimizer = trainer.optimizers[0]
        if not self.scale_lr:
            said.append(f"lr left as it is (scale_lr=False; the plan says {plan.lr:.6g})")
            return
        if trainer.lr_scheduler_configs and not any(
                getattr(c.scheduler, "_batchtune_warmup", False) for c in trainer.lr_scheduler_configs):
            said.append(f"lr left to the scheduler configure_optimizers returned (the plan says "
                        f"{plan.lr:.6g}{f' with {plan.warmup_steps} warm-up steps' if plan.warmup_steps else ''})")
            return
        ratios = group_lr_ratios([float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups])
        for g, ratio in zip(optimizer.param_groups, ratios):
            g["lr"] = plan.lr * ratio
            g.pop("initial_lr", None)
        said.append(f"lr {plan.lr:.6g}")
        if plan.warmup_steps > 0:
            from lightning.pytorch.utilities.types import LRSchedulerConfig

            lr, steps = plan.lr, plan.warmup_steps
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: _core.scheduled_lr(lr, steps, step) / lr)
            scheduler._batchtune_warmup = True
            trainer.strategy.lr_scheduler_configs = [LRSchedulerConfig(scheduler, interval="step")]
            said.append(f"linear warm-up over {steps} optimizer steps")
