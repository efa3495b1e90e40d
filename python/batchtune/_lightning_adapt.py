"""`BatchTune(adapt=True)`: the global batch and lr follow the gradient noise
scale inside Lightning's own loop, by the policy of `Trainer(adapt=True)`.

Lightning trains one batch per `training_step` and steps the optimizer when
its count of the epoch's batches is a multiple of `accumulate_grad_batches`,
dividing each loss by it. So the data hands Lightning micro-batches, step by
step: `_Batches` takes the next global batch of the epoch's order (this
rank's share), cuts it into the step's micro-batches, and starts a new size
only at a step whose first batch Lightning counts at a multiple of the new
accumulation; the callback sets `accumulate_grad_batches` for each batch
from what `_Batches` handed out. The loader asks ahead of the training (one
batch in Lightning's prefetch, more with workers): a decision after step s
reaches the first step the loader had not started yet, and the schedule
records the step it took effect at."""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Deque, Dict, Iterator, List, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from . import _core
from ._adapt import Adaptation, loss_scale_of


class _Batches:
    """Where the train data stands: the epoch's order, the samples taken,
    the micro-batches of the step under way, and the size to take next."""

    def __init__(self, dataset_size: int, shuffle: bool, seed: int, rank: int, world: int,
                 micro: int, accumulation: int):
        self.dataset_size = dataset_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world = world
        self.micro = micro                # per rank, the adapted plan's
        self.accumulation = accumulation
        self.epoch = 0                    # of the order
        self.offset = 0                   # samples of the epoch's order taken (all ranks)
        self.passes = 0                   # Lightning epochs (iterations of the loader) begun
        self.index = 0                    # batches handed out in this pass: Lightning's batch_idx
        self.step_begin = 0               # offset where the step under way began
        self.chunks: List[int] = []       # its micro-batches (per rank)
        self.in_step = 0                  # of them handed out
        self.pending: Optional[Dict[str, Any]] = None  # a decision not yet started
        self.handed: Deque[Dict[str, Any]] = collections.deque()  # for the callback, in order
        self.snapshots: Dict[int, Dict[str, Any]] = {}  # the state before each batch of the pass
        self._resumed = False

    def order(self, epoch: int) -> List[int]:
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch + 1)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def _take_pending(self) -> Optional[Dict[str, Any]]:
        p = self.pending
        if p is None:
            return None
        # Lightning ends a step where its batch count is a multiple of the
        # accumulation: the new one must start at such a count.
        started = self.passes > p["pass"] or self.index >= p["not_before"]
        if not started or self.index % p["change"]["accumulation_steps"] != 0:
            return None
        self.pending = None
        self.micro = p["change"]["micro_batch_size"]
        self.accumulation = p["change"]["accumulation_steps"]
        return p["change"]

    def _start_step(self) -> Optional[Dict[str, Any]]:
        """Begins the next step (its micro-batches in `chunks`): the change it
        starts, if any. `chunks` stays empty where the epoch has no whole
        global batch left."""
        previous = (self.micro, self.accumulation)
        change = self._take_pending()
        self.chunks = []
        self.in_step = 0
        n = self.micro * self.accumulation
        if self.dataset_size - self.offset < n * self.world:
            if change is not None:  # it starts the next epoch instead
                self.pending = {"change": change, "pass": -1, "not_before": 0}
                self.micro, self.accumulation = previous
            return None
        # Without accumulation the step measures against the previous one
        # (`Adaptation.measure_successive`): one part.
        chunks = [self.micro] * self.accumulation
        self.step_begin = self.offset
        self.offset += n * self.world
        self.chunks = chunks
        return change

    def __iter__(self) -> Iterator[List[int]]:
        if not self._resumed:
            # A new pass (Lightning epoch): its batches count from 0, and a step
            # cut short by the end of the last one is not continued.
            self.passes += 1
            self.index = 0
            self.in_step = 0
            self.chunks = []
        self._resumed = False
        self.handed.clear()
        self.snapshots.clear()
        order = self.order(self.epoch)
        share: List[int] = []
        if self.chunks:  # resumed within a step
            share = order[self.step_begin:self.step_begin + sum(self.chunks) * self.world]
            share = share[self.rank::self.world]
        while True:
            before = self.state()
            change = None
            if self.in_step >= len(self.chunks):
                change = self._start_step()
                if not self.chunks:
                    break
                share = order[self.step_begin:self.offset][self.rank::self.world]
            begin = sum(self.chunks[:self.in_step])
            batch = share[begin:begin + self.chunks[self.in_step]]
            self.snapshots[self.index] = before
            self.handed.append(dict(
                index=self.index, accumulate=len(self.chunks), first=self.in_step == 0,
                last=self.in_step == len(self.chunks) - 1, size=len(batch),
                step_samples=sum(self.chunks) * self.world, measure=len(self.chunks) > 1,
                micro=self.micro, accumulation=self.accumulation, change=change))
            self.index += 1
            self.in_step += 1
            yield batch
        # The epoch of the order is over: the next pass begins the next.
        self.epoch += 1
        self.offset = 0
        self.index = 0
        self.in_step = 0
        self.chunks = []
        self.snapshots.clear()

    def end_pass(self) -> None:
        """Lightning's epoch ended (its last batch, or `limit_train_batches`)."""
        self.index = 0
        self.in_step = 0
        self.chunks = []
        self.snapshots.clear()

    # -- checkpoints -------------------------------------------------------

    def state(self) -> Dict[str, Any]:
        return dict(epoch=self.epoch, offset=self.offset, passes=self.passes, index=self.index,
                    step_begin=self.step_begin,
                    chunks=list(self.chunks), in_step=self.in_step, micro=self.micro,
                    accumulation=self.accumulation, seed=self.seed)

    def state_at(self, trained: int) -> Dict[str, Any]:
        """The state after `trained` batches of the pass trained: the loader
        may have handed out more, which a resume hands out again."""
        return dict(self.snapshots.get(trained, self.state()))

    def load_state(self, state: Dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, list(value) if key == "chunks" else value)
        self.offset = int(self.offset)
        if self.chunks and self.in_step >= len(self.chunks):
            self.chunks = []
            self.in_step = 0
        self._resumed = True


class AdaptiveMicroBatchSampler(BatchSampler):
    """The batch sampler `BatchTune(adapt=True)` puts in the train
    dataloader: the micro-batches of each step at the global batch of the
    moment (this rank's share). Lightning may make it again with its own
    `sampler` (a DistributedSampler under DDP); it keeps its own order and
    share of the ranks, so that the global batch stays the next samples of
    the epoch's order."""

    def __init__(self, sampler: Any, batch_size: int = 1, drop_last: bool = True,
                 batches: Optional[_Batches] = None):
        if batches is None:
            raise _core.Error("AdaptiveMicroBatchSampler: BatchTune(adapt=True) makes it with "
                              "its own state; pass your DataLoader a batch_size instead")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.batches = batches

    def __iter__(self) -> Iterator[List[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        # The number of batches changes with the batch: Lightning takes the
        # loader as one of unknown length (a TypeError here) and learns the
        # epoch's last batch by fetching one ahead. BatchSampler's own length
        # (the sampler's samples / the first micro-batch) would end the
        # epoch there, the order's iterator left half-way: the next epoch
        # would begin at the samples that remained, and train none.
        raise TypeError("AdaptiveMicroBatchSampler: has no length; the number of batches an "
                        "epoch changes with the batch under adapt")


class AdaptiveDataLoader(DataLoader):
    """A DataLoader over `AdaptiveMicroBatchSampler`. Where its data stands
    goes into checkpoints with `BatchTune`'s state; `state_dict` here only
    tells Lightning that the loader resumes mid-epoch (it warns otherwise)."""

    def state_dict(self) -> Dict[str, Any]:
        return {"kept_by": "BatchTune"}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass


def adaptive_loader(loader: DataLoader, batches: _Batches) -> DataLoader:
    """`loader` with its batches from `batches`: the same data set, collate_fn,
    workers and the rest."""
    workers = loader.num_workers
    extra: Dict[str, Any] = {}
    if workers > 0:
        extra = dict(prefetch_factor=loader.prefetch_factor,
                     persistent_workers=loader.persistent_workers)
    for name in ("pin_memory_device", "in_order"):
        if hasattr(loader, name):
            extra[name] = getattr(loader, name)
    sampler = AdaptiveMicroBatchSampler(loader.sampler, batches.micro, True, batches=batches)
    return AdaptiveDataLoader(loader.dataset, batch_sampler=sampler, num_workers=workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context,
                      generator=loader.generator, **extra)


def shuffled(loader: DataLoader) -> bool:
    sampler = loader.sampler
    return isinstance(sampler, RandomSampler) or bool(getattr(sampler, "shuffle", False))


class LightningAdaptation:
    """What `BatchTune(adapt=True)` keeps during fit: the policy
    (`Adaptation`), the data's state, the decision not yet started, the lr
    gain already applied to the optimizer and its schedulers."""

    def __init__(self, plan: Any, every: int, max_global_batch: Optional[int], clock,
                 batches: _Batches, lr: str = "gain", min_global_batch: Optional[int] = None,
                 speeds: Optional[Dict[int, Any]] = None):
        self.base = plan
        self.current = dataclasses.replace(plan, reasons=list(plan.reasons),
                                           warnings=list(plan.warnings))
        self.adaptation = Adaptation(plan, every, max_global_batch, clock, None, lr,
                                     min_global_batch, speeds)
        self.batches = batches
        self.pending: Optional[Dict[str, Any]] = None  # decided, not trained yet
        self.gain = 1.0                                # applied to the lrs
        self.trained = 0                               # batches of this pass trained
        self.info: Optional[Dict[str, Any]] = None     # of the batch under way
        self.small: Optional[tuple] = None             # (samples, squared norm) of a first part
        self.stepped = False

    @property
    def schedule(self) -> List[Dict[str, Any]]:
        return self.adaptation.schedule

    # -- the lr ------------------------------------------------------------

    def target_gain(self, step: int) -> float:
        lr = self.adaptation.lr_at(step, self.current.lr)
        return lr / self.base.lr if self.base.lr > 0 else 1.0

    def apply_gain(self, trainer: Any, step: int) -> None:
        """Scales every parameter group's lr, and the base lrs of the
        schedulers, by the change of the gain since the last step: the
        schedule (a warm-up, yours) goes on, times the gain."""
        gain = self.target_gain(step)
        factor = gain / self.gain
        if factor == 1.0:
            return
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor
                if "initial_lr" in group:
                    group["initial_lr"] = group["initial_lr"] * factor
        for config in trainer.lr_scheduler_configs:
            base = getattr(config.scheduler, "base_lrs", None)
            if base is not None:
                config.scheduler.base_lrs = [lr * factor for lr in base]
        self.gain = gain

    # -- checkpoints -------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return dict(adaptation=self.adaptation.state_dict(),
                    current={k: getattr(self.current, k) for k in (
                        "global_batch_size", "micro_batch_size", "accumulation_steps", "lr")},
                    data=self.batches.state_at(self.trained),
                    pending=dict(self.pending) if self.pending is not None else None,
                    gain=self.gain)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.adaptation.load_state_dict(state["adaptation"],
                                        "BatchTune's checkpoint state['adapt']['adaptation']")
        for k, v in state["current"].items():
            setattr(self.current, k, v)
        self.batches.load_state(state["data"])
        self.pending = dict(state["pending"]) if state["pending"] is not None else None
        self.batches.pending = dict(self.pending) if self.pending is not None else None
        self.gain = float(state["gain"])
        self.trained = int(state["data"]["index"])

    # -- the hooks' work ---------------------------------------------------

    def measure_first_part(self, module: torch.nn.Module, scaler: Optional[Any]) -> None:
        """After the backward of a measured step's first part: its mean
        gradient is `accumulate` x the gradient so far (Lightning divided
        each loss by the accumulation), and fp16's `scaler` multiplied it."""
        info = self.info
        if info is None or not info["measure"] or not info["first"]:
            return
        scale = scaler.get_scale() if scaler is not None else 1.0
        sq = (_core.squared_gradient_norm(list(module.parameters()))
              * float(info["accumulate"]) ** 2 / scale ** 2)
        self.small = (info["size"], sq)

    def measure_step(self, module: torch.nn.Module, scaler: Optional[Any] = None) -> None:
        """Before the optimizer step: the step's mean gradient (over every rank
        under DDP, whose all-reduce ran on the last part; the first ran
        without it). `scaler`: fp16's GradScaler where the gradients are
        still scaled by it here (`still_scaled_by`), else None."""
        self.stepped = True
        if self.info is None:
            return
        parameters = list(module.parameters())
        if self.info["accumulate"] == 1:
            self.adaptation.measure_successive(parameters, self.info["step_samples"],
                                               loss_scale_of(scaler))
            return
        self.adaptation.successive.reset()
        if self.small is None:
            return
        small, small_sq = self.small
        self.small = None
        big = self.info["step_samples"]
        if big > small:
            # The first part's norm is unscaled already (measure_first_part).
            scale = scaler.get_scale() if scaler is not None else 1.0
            self.adaptation.measure(small, small_sq, big,
                                    _core.squared_gradient_norm(parameters) / scale ** 2, 1.0)


def still_scaled_by(precision_plugin: Any, optimizer: Any) -> Optional[Any]:
    """The GradScaler whose scale the gradients still carry before the
    optimizer step, or None. Lightning's fp16 ("16-mixed") unscales them
    before `on_before_optimizer_step`, except for an optimizer that unscales
    itself in its step (`AdamW(fused=True)`: `_step_supports_amp_scaling`),
    which it leaves scaled, by 65536 at first."""
    scaler = getattr(precision_plugin, "scaler", None)
    if scaler is None:
        return None
    optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer's own
    return scaler if getattr(optimizer, "_step_supports_amp_scaling", False) else None
