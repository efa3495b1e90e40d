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
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from . import _checks, _core
from ._fit import missing
from ._lightning_adapt import LightningAdaptation, _Batches, adaptive_loader, shuffled
from ._samples import HeaviestFirst
from ._tune import TuneResult, tune
from .plan import Plan, group_lr_ratios, reference_lr

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
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
        adapt: the global batch and lr follow the gradient noise scale as
            training goes, by the policy of `batchtune.Trainer(adapt=True)`:
            every `adapt_every` optimizer steps the global batch may double or
            halve where goodput says so, from the plan's up to
            `adapt_max_batch` (default 32x), the micro-batch growing up to the
            largest the tune saw fit and then accumulating; the lr follows by
            the AdaScale gain (ramped over 20 steps) on top of the schedule.
            The train dataloader is made again with a batch sampler that hands
            out the next micro-batches of the global batch of the moment.
        adapt_seed: the seed of the epochs' order under adapt (the same on
            every rank).
        clock: a callable returning seconds, which times the windows adapt
            compares (tests pass a fake one).
        tune_kwargs: more `batchtune.tune` options (`max_batch`, `tolerance`,
            `lr_scaling`, `warmup_steps`, `strategy`, `verbose`, ...).

    After fit starts: `result` (this rank's `TuneResult`) and `plan`. The plan
    is kept in checkpoints: a resumed fit trains with it without tuning again.
    With adapt, `batch_schedule` lists the changes (the first the start) and
    checkpoints keep where the schedule and the data stand.
    """

    def __init__(self, *, objective: str = "throughput", amp: Optional[str] = None,
                 target_batch: Optional[int] = None, margin: float = _core.DEFAULT_MARGIN,
                 time_budget: float = _core.DEFAULT_TIME_BUDGET, report: Optional[str] = None,
                 memory_limit=None, batch_arg_name: str = "batch_size", scale_lr: bool = True,
                 base_lr: Optional[float] = None, base_batch: Optional[int] = None,
                 make_batch: Optional[Callable[[int], Any]] = None,
                 loss_fn: Optional[Callable] = None, adapt: bool = False,
                 adapt_every: int = _core.DEFAULT_ADAPT_EVERY,
                 adapt_max_batch: Optional[int] = None, adapt_seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter, **tune_kwargs: Any):
        super().__init__()
        if not isinstance(adapt, bool):
            raise _core.Error(f"adapt: give True or False, got {adapt!r}")
        for name, value, least in (("adapt_every", adapt_every, 1),
                                   ("adapt_max_batch", adapt_max_batch, 1),
                                   ("adapt_seed", adapt_seed, 0)):
            if value is None and name == "adapt_max_batch":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise _core.Error(f"{name}: give a whole number of at least {least}, got {value!r}")
        if adapt and not scale_lr:
            raise _core.Error("adapt: moves the lr with the batch, which scale_lr=False turns off; "
                              "drop one of them")
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
        self.adapt = adapt
        self.adapt_every = adapt_every
        self.adapt_max_batch = adapt_max_batch
        self.adapt_seed = adapt_seed
        self.clock = clock
        self.result: Optional[TuneResult] = None
        self.plan: Optional[Plan] = None
        self._group = None
        self._restored: Optional[Plan] = None
        self._restored_adapt: Optional[Dict[str, Any]] = None
        self._adapt: Optional[LightningAdaptation] = None
        self._fits = 0          # the largest micro-batch the tune saw fit (all ranks)
        self._hooked = None     # (the data source, whose train_dataloader adapt wraps)

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
        if self.adapt:
            self._check_adapt(trainer)

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        plan = self._restored
        if plan is None:
            plan = self._tune(trainer, pl_module)
        self.plan = plan
        self._apply(trainer, pl_module, plan, resumed=self._restored is not None)
        if self.adapt:
            self._start_adapt(trainer, pl_module, plan)

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"plan": self.plan.to_dict()} if self.plan is not None else {}
        if self._adapt is not None:
            state["adapt"] = self._adapt.state_dict()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if state_dict.get("plan"):
            self._restored = Plan(**state_dict["plan"])
        self._restored_adapt = state_dict.get("adapt")

    @property
    def batch_schedule(self) -> List[Dict[str, Any]]:
        """With adapt: one entry per change of the global batch (the first the
        start): step (the optimizer step it took effect at), global_batch_size,
        micro_batch_size, accumulation_steps, lr, noise_scale, reason — as
        `batchtune.Trainer.batch_schedule`. Empty without adapt."""
        return [dict(c) for c in self._adapt.schedule] if self._adapt is not None else []

    @property
    def noise_scale(self) -> Optional[float]:
        """With adapt: the gradient noise scale measured so far (None before)."""
        if self._adapt is None:
            return None
        self._adapt.adaptation._flush()
        return self._adapt.adaptation.noise.noise_scale()

    # -- adapt: the hooks of a step ----------------------------------------

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._adapt is not None:
            self._adapt.trained = 0

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                             batch: Any, batch_idx: int) -> None:
        a = self._adapt
        if a is None:
            return
        if not a.batches.handed:
            raise _core.Error("adapt: the train dataloader's batch did not come from BatchTune's "
                              "batch sampler; return the DataLoader from train_dataloader() "
                              "unchanged (no wrapper around it)")
        info = a.batches.handed.popleft()
        a.info = info
        a.stepped = False
        if info["first"]:
            a.small = None
        # Lightning divides the loss by it and steps where its count reaches a
        # multiple of it: the micro-batches of this step.
        trainer.accumulate_grad_batches = info["accumulate"]
        if info["change"] is not None:
            self._adapt_started(trainer, pl_module, info["change"])
        if info["first"]:
            a.apply_gain(trainer, trainer.global_step)

    def on_after_backward(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._adapt is not None:
            self._adapt.measure_first_part(pl_module,
                                           getattr(trainer.precision_plugin, "scaler", None))

    def on_before_optimizer_step(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                                 optimizer: torch.optim.Optimizer) -> None:
        if self._adapt is not None:
            self._adapt.measure_step(pl_module)

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        a = self._adapt
        if a is None or a.info is None:
            return
        a.trained += 1
        if not (a.info["last"] and a.stepped):
            return
        a.adaptation.trained(a.info["step_samples"])
        step = trainer.global_step
        pl_module.log("batchtune/global_batch_size", float(a.current.global_batch_size),
                      on_step=True, on_epoch=False)
        if step % a.adaptation.every != 0 or a.pending is not None:
            return
        change = a.adaptation.decide(step, a.current, pl_module.device)
        if change is None:
            return
        # The loader has handed out batches ahead of the training: the change
        # starts at the first step it has not begun (the schedule says which).
        a.pending = {"change": change, "pass": a.batches.passes, "not_before": a.batches.index}
        a.batches.pending = dict(a.pending)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._adapt is not None:
            self._adapt.batches.end_pass()
            self._adapt.trained = 0

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                 stage: Optional[str] = None) -> None:
        if self._hooked is not None:
            self._hooked.__dict__.pop("train_dataloader", None)
            self._hooked = None

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
        self._fits = result.max_batch_size
        if world <= 1:
            if own < 1:
                self._none_fits(pl_module, result, "here")
            return result.plan
        # The job trains at the smallest of the ranks' choices: the plan of
        # the first rank that chose it, which planned the job for itself.
        root = trainer.strategy.root_device
        job = int(trainer.strategy.reduce(torch.tensor(own, device=root), reduce_op="min").item())
        self._fits = int(trainer.strategy.reduce(torch.tensor(self._fits, device=root),
                                                 reduce_op="min").item())
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

    # -- adapt -------------------------------------------------------------

    def _check_adapt(self, trainer: "pl.Trainer") -> None:
        strategy = trainer.strategy
        if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) or \
                strategy.handles_gradient_accumulation:
            raise _core.Error(f"adapt: runs on one device or under DDP, not with "
                              f"{type(strategy).__name__}; use strategy='ddp' or leave adapt off")
        if any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
            raise _core.Error("adapt: sets the accumulation of every step, which a "
                              "GradientAccumulationScheduler callback sets too; remove it or leave "
                              "adapt off")
        for name in ("val_check_interval", "limit_train_batches"):
            value = getattr(trainer, name)
            if isinstance(value, float) and value != 1.0:
                raise _core.Error(f"{name}: {value} is a share of the epoch's batches, whose number "
                                  f"changes with the batch under adapt; give a number of batches "
                                  f"(an int) or 1.0")
        if trainer.reload_dataloaders_every_n_epochs:
            raise _core.Error("adapt: the train dataloader's batch sampler carries the data's place "
                              "across epochs; leave reload_dataloaders_every_n_epochs at 0")

    def _start_adapt(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                     plan: Plan) -> None:
        source = trainer.fit_loop._data_source
        instance = source.instance
        if instance is None or not hasattr(instance, "train_dataloader"):
            raise _core.Error("adapt: needs the train dataloader from train_dataloader() of the "
                              "LightningModule or the LightningDataModule")
        instance.__dict__.pop("train_dataloader", None)  # a wrapper a failed fit left
        original = instance.train_dataloader
        loader = _one_loader(original())
        try:
            size = len(loader.dataset)
        except TypeError:
            raise _core.Error("adapt: the train dataloader's data set has no len(); adapt hands "
                              "out its indices, so give a map-style data set") from None
        batches = _Batches(size, shuffled(loader), self.adapt_seed, trainer.global_rank,
                           trainer.world_size, plan.micro_batch_size, plan.accumulation_steps)
        adapt = LightningAdaptation(plan, self.adapt_every, self.adapt_max_batch, self.clock,
                                    batches)
        if self._fits > 0:
            # Lightning has no out-of-memory recovery: the micro-batch grows up
            # to what the tune saw fit, then the step accumulates.
            adapt.adaptation.adapter.cap_micro_batch(max(self._fits, plan.micro_batch_size))
        if self._restored_adapt is not None:
            adapt.load_state_dict(self._restored_adapt)
            self._restored_adapt = None
            c = adapt.current
            rank_zero_info(f"batchtune: adapt resumed at global batch {c.global_batch_size} "
                           f"(micro-batch {c.micro_batch_size} x {c.accumulation_steps}), "
                           f"{len(adapt.schedule) - 1} change(s) so far")
        self._adapt = adapt

        def train_dataloader():
            return adaptive_loader(_one_loader(original()), batches)

        # Lightning asks the data source for the loader (again) after
        # on_fit_start; this one hands out the adapted micro-batches.
        instance.__dict__["train_dataloader"] = train_dataloader
        self._hooked = instance

    def _adapt_started(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                       change: Dict[str, Any]) -> None:
        """The first batch of a change decided earlier is being trained."""
        a = self._adapt
        step = trainer.global_step
        lr_now = a.adaptation.lr_at(step, a.current.lr)
        before = a.current.global_batch_size
        change = dict(change, step=step)
        for key in ("global_batch_size", "micro_batch_size", "accumulation_steps", "lr"):
            setattr(a.current, key, change[key])
        a.adaptation.apply(change, step, lr_now)
        a.adaptation.restart_window()
        a.pending = None
        lightning_setattr(pl_module, self.batch_arg_name, change["micro_batch_size"])
        rank_zero_info(f"batchtune: step {step}: global batch {before} -> "
                       f"{change['global_batch_size']} (micro-batch {change['micro_batch_size']} "
                       f"x {change['accumulation_steps']}), lr {change['lr']:.3g}: "
                       f"{change['reason']}")
