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

Sequences of varying length: `BatchTune(lengths="auto")` tunes by them and
trains by the plan's token budget (the train loader's batch sampler a
`TokenBudgetSampler`, one micro-batch a rank a step)::

    trainer = L.Trainer(accelerator="cpu", max_epochs=1,
                        callbacks=[BatchTune(lengths="auto", memory_limit="256MiB")])

Needs Lightning (`pip install lightning`); `import batchtune` does not.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

import torch

from . import _checks, _core
from ._adapt import adapt_arguments
from ._configuration import apply_configuration
from ._fit import missing
from ._lengths import parse_lengths
from ._lightning_adapt import (LightningAdaptation, _Batches, adaptive_loader, shuffled,
                               still_scaled_by)
from ._results import TuneResult
from ._sharded import is_sharded
from .plan import Plan
from .token_sampler import TokenBudgetSampler

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
    from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr
    from lightning.pytorch.utilities.rank_zero import rank_zero_info
except ImportError as _error:  # Lightning is optional
    raise missing("batchtune.lightning", "Lightning", "lightning", _error) from None

from ._lightning_plan import amp_mismatch, apply_plan, switchable, trainer_amp  # noqa: E402
from ._lengths import dataset_lengths  # noqa: E402
from ._lightning_tokens import ItemWeights, token_loader  # noqa: E402
from ._lightning_tune import job_plan, one_loader, train_loader, tune_module  # noqa: E402

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
            every `adapt_every` (default 50) optimizer steps the global batch may double or
            halve where goodput says so, up to `adapt_max_batch` (default 32x
            the plan's) and down to `adapt_min_batch` (default the plan's /
            32; the plan's own to never go below it), the micro-batch growing up to the
            largest the tune saw fit and then accumulating; the lr follows
            (ramped over 20 steps, on top of the schedule) the plan's scaling
            rule applied to the AdaScale gain, or with `adapt_lr="batch"` to
            the batch ratio alone. A global batch not yet run is tried only
            where the tune's sweep says its speed can win (`adapt_speeds` of
            the Trainer, filled in from this callback's own tune).
            The train dataloader is made again with a batch sampler that hands
            out the next micro-batches of the global batch of the moment.
            `adapt_every`, `adapt_max_batch`, `adapt_min_batch` and `adapt_lr`
            are refused without `adapt=True`.
        adapt_seed: the seed of the epochs' order under adapt or with
            `lengths` (the same on every rank).
        lengths: sequences of varying length — every sample's tokens, in
            the data set's order (a list of ints), or "auto" (read from each
            sample of the train dataloader's data set: its `input_ids`, else
            its first sequence). The tune runs by them (`batchtune.tune(...,
            lengths=...)`, its batches the longest samples cut to each length,
            or your `make_batch(n, length)`) and plans a token budget; the
            train dataloader is made again over a `TokenBudgetSampler`
            (every micro-batch at most the budget's padded tokens, every
            sample once an epoch, reshuffled by the epoch; under DDP each rank
            its own share, the same count on every rank), with its collate_fn
            kept (`batchtune.pad_collate` where it had the default one).
            Each optimizer step is one micro-batch a rank
            (`accumulate_grad_batches` 1): Lightning divides accumulated
            losses by their count alike, which would weigh a token of a short
            micro-batch more than one of a long one; one micro-batch a step
            keeps the module's own per-token mean. Hence no `target_batch`
            (the step is one budget a rank, the lr scaled to the samples it
            holds at the data's mean length) and no `adapt`.
        loss_items: with `lengths` under DDP, `loss_items(batch)` → the
            items the module's loss averages over (e.g. its label tokens):
            each rank's loss is weighted by its share of all ranks' items, so
            that DDP's average is the step's per-token mean, as
            `batchtune.Trainer(loss_items=...)` does; without it the ranks'
            means count alike (each micro-batch fills the same budget).
        clock: a callable returning seconds, which times the windows adapt
            compares (tests pass a fake one).
        tune_kwargs: more `batchtune.tune` options (`max_batch`, `tolerance`,
            `lr_scaling`, `warmup_steps`, `strategy`, `verbose`, ...).

    After fit starts: `result` (this rank's `TuneResult`) and `plan`. The plan
    is kept in checkpoints: a resumed fit trains with it without tuning again.
    With adapt, `batch_schedule` lists the changes (the first the start) and
    checkpoints keep where the schedule and the data stand. With `lengths`,
    `sample_lengths` and `token_sampler` (its `padding()`: the epoch's real
    and padded tokens).
    """

    def __init__(self, *, objective: str = "throughput", amp: Optional[str] = None,
                 target_batch: Optional[int] = None, margin: float = _core.DEFAULT_MARGIN,
                 time_budget: float = _core.DEFAULT_TIME_BUDGET, report: Optional[str] = None,
                 memory_limit=None, batch_arg_name: str = "batch_size", scale_lr: bool = True,
                 base_lr: Optional[float] = None, base_batch: Optional[int] = None,
                 make_batch: Optional[Callable[[int], Any]] = None,
                 loss_fn: Optional[Callable] = None, adapt: bool = False,
                 adapt_every: Optional[int] = None,
                 adapt_max_batch: Optional[int] = None, adapt_lr: Optional[str] = None,
                 adapt_min_batch: Optional[int] = None, adapt_seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter, lengths: Any = None,
                 loss_items: Optional[Callable[[Any], Any]] = None, **tune_kwargs: Any):
        super().__init__()
        # adapt_every and the rest only with adapt=True, as Trainer(adapt=True).
        adapt_every, adapt_lr = adapt_arguments(adapt, adapt_every, adapt_max_batch, adapt_lr,
                                                adapt_min_batch)
        _checks.integer("adapt_seed", adapt_seed, 0)
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
        _check_lengths(lengths, loss_items, adapt, target_batch)
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
        self.adapt_min_batch = adapt_min_batch
        self.adapt_lr = adapt_lr
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
        self.lengths = lengths
        self.loss_items = loss_items
        self.sample_lengths: Optional[List[int]] = None  # every sample's, resolved
        self.token_sampler: Optional[TokenBudgetSampler] = None
        self._weights: Optional[ItemWeights] = None

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
                not switchable(trainer, self.amp):
            raise amp_mismatch(trainer, f"'{self.amp}'")
        if self.target_batch is not None and any(
                isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
            raise _core.Error("target_batch: a GradientAccumulationScheduler callback sets the "
                              "accumulation; remove it or leave target_batch unset")
        if self.lengths is not None and any(
                isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
            raise _core.Error("lengths: trains one micro-batch of the token budget a step, and a "
                              "GradientAccumulationScheduler callback would accumulate them alike; "
                              "remove it")
        if self.adapt:
            self._check_adapt(trainer)

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        _check_strategy(trainer, "BatchTune")
        plan = self._restored
        if plan is None:
            if self.target_batch is not None:  # before the tune's time is spent
                _check_data_holds_a_step(train_loader(trainer, pl_module), self.target_batch,
                                         "target_batch")
            plan = self._tune(trainer, pl_module)
        if plan.token_budget > 0 and self.lengths is None:
            raise _core.Error("lengths: the checkpoint's plan trains by a token budget; give "
                              "BatchTune(lengths=...) as the run that saved it did")
        self.plan = plan
        # Checkpointing and the memory format as the plan keeps them (a tune
        # left them so; a resumed plan sets them here). The batch's images
        # follow the first convolution's channels_last weights.
        apply_configuration(pl_module, plan)
        apply_plan(trainer, pl_module, plan, batch_arg_name=self.batch_arg_name,
                   scale_lr=self.scale_lr, report=self.result.report if self.result else None,
                   resumed=self._restored is not None)
        if plan.token_budget == 0:  # the loader as the plan makes it (its batch_size set)
            _check_data_holds_a_step(train_loader(trainer, pl_module), plan.global_batch_size,
                                     "target_batch" if self._restored is None else "plan")
        if self.adapt:
            self._start_adapt(trainer, pl_module, plan)
        if self.lengths is not None:
            self._start_tokens(trainer, pl_module, plan)

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
        if self.token_sampler is not None:  # before the epoch's loader iterator is made
            self.token_sampler.set_epoch(trainer.current_epoch)
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
            self._adapt.measure_step(pl_module, still_scaled_by(trainer.precision_plugin, optimizer))

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        a = self._adapt
        if a is None or a.info is None:
            return
        a.trained += 1
        if not (a.info["last"] and a.stepped):
            return
        a.adaptation.trained(a.info["step_samples"], pl_module.device)
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
        if self._weights is not None:
            self._weights.remove()
            self._weights = None

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

    def _tune(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> Plan:
        if self.lengths is not None:
            self.sample_lengths = self._sample_lengths(train_loader(trainer, pl_module))
        # A sharded module's trials gather over every rank, in lockstep: the
        # default group. Else each rank alone, agreeing afterwards.
        group = None if is_sharded(pl_module) else self._local_group(trainer)
        self.result = tune_module(trainer, pl_module, self, group)
        if not self.result.complete:
            raise KeyboardInterrupt
        plan, self._fits = job_plan(trainer, pl_module, self.result)
        return plan

    # -- sequences of varying length -----------------------------------------

    def _sample_lengths(self, loader: torch.utils.data.DataLoader) -> List[int]:
        """Every sample's length: as given, or read from the data set."""
        if isinstance(self.lengths, str):
            lengths = dataset_lengths(loader.dataset, source="lengths")
        else:
            lengths = parse_lengths(list(self.lengths)).samples
        try:
            size = len(loader.dataset)
        except TypeError:
            raise _core.Error("lengths: the train dataloader's data set has no len(); the token "
                              "budget's batch sampler hands out its indices, so give a map-style "
                              "data set") from None
        if len(lengths) != size:
            raise _core.Error(f"lengths: {len(lengths)} lengths for a train data set of {size} "
                              "samples; give one a sample, in its order (or \"auto\")")
        return lengths

    def _start_tokens(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                      plan: Plan) -> None:
        """The train dataloader made again over a `TokenBudgetSampler` of the
        plan (each rank its share), and under DDP with `loss_items` the
        ranks' losses weighted by their items."""
        instance, original, loader = _train_loader_source(trainer, "lengths")
        if self.sample_lengths is None:  # resumed with the checkpoint's plan: no tune ran
            self.sample_lengths = self._sample_lengths(loader)
        tokens = TokenBudgetSampler(self.sample_lengths, plan, shuffle=shuffled(loader),
                                    seed=self.adapt_seed, num_replicas=trainer.world_size,
                                    rank=trainer.global_rank)
        self.token_sampler = tokens

        def train_dataloader():
            return token_loader(one_loader(original()), tokens)

        # Lightning asks the data source for the loader (again) after
        # on_fit_start; this one hands out the token budget's micro-batches.
        instance.__dict__["train_dataloader"] = train_dataloader
        self._hooked = instance
        if self.loss_items is not None and trainer.world_size > 1:
            self._weights = ItemWeights(trainer.strategy, trainer.world_size, pl_module,
                                        self.loss_items)
            self._weights.install()
        padding = tokens.padding()
        rank_zero_info(f"batchtune: {len(tokens)} micro-batches an epoch a rank, "
                       f"{padding['tokens']} tokens padded to {padding['padded_tokens']}")

    # -- adapt -------------------------------------------------------------

    def _check_adapt(self, trainer: "pl.Trainer") -> None:
        _check_strategy(trainer, "adapt")
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
        instance, original, loader = _train_loader_source(trainer, "adapt")
        try:
            size = len(loader.dataset)
        except TypeError:
            raise _core.Error("adapt: the train dataloader's data set has no len(); adapt hands "
                              "out its indices, so give a map-style data set") from None
        batches = _Batches(size, shuffled(loader), self.adapt_seed, trainer.global_rank,
                           trainer.world_size, plan.micro_batch_size, plan.accumulation_steps)
        # The tune's sweep: a batch not yet run is tried only where its speed
        # ratio says it can win, as after `train --adapt`'s quick tune.
        speeds = self.result.speed_profile() if self.result is not None else None
        adapt = LightningAdaptation(plan, self.adapt_every, self.adapt_max_batch, self.clock,
                                    batches, self.adapt_lr, self.adapt_min_batch, speeds)
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
            return adaptive_loader(one_loader(original()), batches)

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


def _check_lengths(lengths: Any, loss_items: Any, adapt: bool, target_batch: Optional[int]) -> None:
    """`BatchTune`'s `lengths` and what goes with it, checked when it is made."""
    if loss_items is not None and not callable(loss_items):
        raise TypeError("loss_items: must be a function fn(batch) -> the number of items the loss "
                        f"of batch averages over, got {type(loss_items).__name__}")
    if lengths is None:
        if loss_items is not None:
            raise _core.Error("loss_items: weighs the ranks' micro-batches of a token budget; give "
                              "lengths=... too, or leave it out")
        return
    if isinstance(lengths, str):
        if lengths != "auto":
            raise _core.Error(f"lengths: '{lengths}' is not \"auto\"; give \"auto\" (read from the "
                              "train data set) or every sample's length (a list of ints)")
    elif isinstance(lengths, tuple) and len(lengths) == 2:
        raise _core.Error("lengths: a (shortest, longest) range does not say which sample is which; "
                          "BatchTune cuts every epoch by each sample's length: give the list (one a "
                          "sample) or \"auto\"")
    else:
        parse_lengths(list(lengths) if isinstance(lengths, tuple) else lengths)
    if adapt:
        raise _core.Error("adapt: changes a batch of samples, and lengths= trains by a token "
                          "budget; leave one of them out")
    if target_batch is not None:
        raise _core.Error("target_batch: with lengths= each optimizer step is one micro-batch of the "
                          "token budget a rank (accumulate_grad_batches 1, so that the loss stays a "
                          "per-token mean); leave target_batch unset")


def _check_strategy(trainer: "pl.Trainer", what: str) -> None:
    """One device, DDP (each rank tuned alone, agreeing afterwards) or, for the
    tune, `ModelParallelStrategy` as FSDP2 alone (its trials in lockstep over
    the ranks). Tensor parallelism, FSDP1 and DeepSpeed run collectives the
    trials cannot meet around; refused in one line."""
    strategy = trainer.strategy
    if what != "adapt" and _fsdp2_alone(strategy):
        return
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) or \
            strategy.handles_gradient_accumulation:
        tail = "" if what == "adapt" else \
            " or ModelParallelStrategy(tensor_parallel_size=1) (FSDP2 alone)"
        raise _core.Error(f"{what}: runs on one device or under DDP{tail}, not with "
                          f"{type(strategy).__name__}; use strategy='ddp', or for a model "
                          f"sharded with fully_shard call batchtune.tune and batchtune.Trainer "
                          f"in your own loop")


def _fsdp2_alone(strategy: Any) -> bool:
    """Lightning's ModelParallelStrategy with a tensor-parallel size of 1:
    the module's own `fully_shard` over every rank, nothing else."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if not isinstance(strategy, ModelParallelStrategy):
        return False
    try:
        return strategy.device_mesh["tensor_parallel"].size() == 1
    except (RuntimeError, KeyError):  # no mesh yet, or one without that dimension
        return False


def _check_data_holds_a_step(loader: torch.utils.data.DataLoader, global_batch: int,
                             name: str) -> None:
    """An epoch of the train data set holds one global batch at least, as the
    CLI's `train` asks: with fewer samples an epoch under adapt trains no step
    (what is left of a global batch is dropped), and without it one short
    step at the lr of the whole batch. `name`: "target_batch" (asked for, or
    the plan tuned for it) or "plan" (a checkpoint's)."""
    try:
        size = len(loader.dataset)
    except TypeError:
        return  # an iterable data set: its size is not known
    if size >= global_batch:
        return
    if name == "plan":
        raise _core.Error(f"plan: the checkpoint's global batch {global_batch} is larger than the "
                          f"{size} samples of train_dataloader()'s data set, so an epoch trains no "
                          "whole step; resume on the data the checkpoint trained on, or start "
                          "without it")
    raise _core.Error(f"target_batch: the global batch {global_batch} is larger than the {size} "
                      "samples of train_dataloader()'s data set, so an epoch trains no whole "
                      f"step; give target_batch={size} or less")


def _train_loader_source(trainer: "pl.Trainer", what: str):
    """Where the train dataloader comes from, to make it again: the module
    or data module that defines `train_dataloader()`, that method (a wrapper
    a failed fit left taken off) and the loader it makes now. `what` names
    the argument that needs it."""
    instance = trainer.fit_loop._data_source.instance
    if instance is None or not hasattr(instance, "train_dataloader"):
        raise _core.Error(f"{what}: needs the train dataloader from train_dataloader() of the "
                          "LightningModule or the LightningDataModule")
    instance.__dict__.pop("train_dataloader", None)  # a wrapper a failed fit left
    original = instance.train_dataloader
    return instance, original, one_loader(original())
