"""`Trainer(adapt=True)`: the global batch and lr follow the gradient noise
scale, by the library's own policy (`train --adapt`, batch_adapter.h), and
`AdaptiveBatchSampler` hands the loader the next batch at the size of the
moment."""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from . import _checks, _core, _distributed


def loss_scale_of(scaler: Optional[Any]) -> Optional[torch.Tensor]:
    """A GradScaler's scale as the tensor it keeps on the device (reading it
    with `get_scale()` would wait for the step); None without a scaler or
    before its first `scale()`."""
    return getattr(scaler, "_scale", None) if scaler is not None else None


def check_arguments(every: Any, max_global_batch: Any, lr: Any = "gain",
                    min_global_batch: Any = None) -> None:
    """`adapt_every`, `adapt_max_batch`, `adapt_lr` and `adapt_min_batch` of a
    `Trainer` or the Lightning callback, before anything runs: whole numbers
    (a `TypeError` otherwise), in the policy's own range
    (`check_adapt_options`); None or 0 for the largest or smallest batch is
    the default; the lr rule "gain" or "batch"."""
    _checks.whole("adapt_every", every)
    if max_global_batch is not None:
        _checks.whole("adapt_max_batch", max_global_batch)
    if min_global_batch is not None:
        _checks.whole("adapt_min_batch", min_global_batch)
    _core.check_adapt_options(every, max_global_batch or 0, str(lr), min_global_batch or 0)


def speed_profile(speeds: Optional[Mapping[int, Any]]) -> Dict[int, Tuple[float, float, float]]:
    """`adapt_speeds` checked, as (median, low, high) by global batch: each
    batch a whole number of at least 1, its speed positive samples/s, a
    number (the median alone) or a `(median, low, high)` triple with its
    interval, as `TuneResult.speed_profile()` gives them; None for none."""
    if speeds is None:
        return {}
    if not isinstance(speeds, Mapping):
        raise TypeError(f"adapt_speeds: must map a global batch to its samples/s, like "
                        f"result.speed_profile(); got {type(speeds).__name__}")
    profile = {}
    for batch, speed in speeds.items():
        size = _checks.integer("adapt_speeds", batch)
        triple = tuple(speed) if isinstance(speed, (tuple, list)) else (speed, speed, speed)
        if len(triple) != 3 or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or
                                   not (0 < v < math.inf) for v in triple) or \
                not triple[1] <= triple[0] <= triple[2]:
            raise _core.Error(f"adapt_speeds: the speed of global batch {size} must be positive "
                              f"samples/s, or (median, low, high) with low <= median <= high; "
                              f"got {speed!r}")
        profile[size] = tuple(float(v) for v in triple)
    return profile


def adapt_lr_rule(adapt: bool, lr: Optional[Any]) -> str:
    """The lr rule of `adapt_lr` (None: "gain", the default); refused when
    given without `adapt`, as `train --adapt-lr` is without `--adapt`."""
    if lr is not None and not adapt:
        raise _core.Error("adapt_lr: tunes adapt; give adapt=True, or leave it out")
    return "gain" if lr is None else lr


class Adaptation:
    """What a `Trainer` with `adapt=True` keeps: the policy, the noise
    estimate, the schedule of changes and the lr ramp after one. `lr` is
    the rule the lr follows: "gain" (AdaScale's) or "batch" (the batch ratio)."""

    def __init__(self, plan: Any, every: int, max_global_batch: Optional[int],
                 clock: Callable[[], float], group: Optional[Any], lr: str = "gain",
                 min_global_batch: Optional[int] = None,
                 speeds: Optional[Mapping[int, Any]] = None):
        check_arguments(every, max_global_batch, lr, min_global_batch)
        # The policy checks adapt_max_batch and adapt_min_batch against the
        # plan's global batch.
        self.adapter = _core.BatchAdapter(plan.global_batch_size, plan.lr, plan.lr_scaling,
                                          plan.world_size, every, max_global_batch or 0, lr,
                                          min_global_batch or 0, speed_profile(speeds))
        self.noise = _core.NoiseScaleEstimator()
        self.successive = _core.SuccessiveGradients()
        self.every = every
        self.clock = clock
        self.group = group
        self.schedule: List[Dict[str, Any]] = [dict(
            step=0, global_batch_size=plan.global_batch_size,
            micro_batch_size=plan.micro_batch_size, accumulation_steps=plan.accumulation_steps,
            lr=plan.lr, noise_scale=None,
            reason="the plan's global batch and lr, where adapt starts")]
        self.ramp_from = plan.lr
        self.ramp_start = -1
        self._pending: List[tuple] = []  # (small, small_sq, big, big_sq, scale) device scalars
        self._samples = 0
        self.adapter.restart_window(clock(), 0)

    # -- measuring ---------------------------------------------------------

    def small_batch(self, n: int, micro: int) -> int:
        """The samples to measure first on this step: its first micro-batch
        under accumulation (free), else 0, as a step without accumulation
        measures against the previous ones (`measure_successive`)."""
        return micro if n > micro else 0

    def measure_successive(self, parameters: List[torch.Tensor], size: int,
                           loss_scale: Optional[torch.Tensor]) -> None:
        """A step without accumulation over `size` samples (all ranks'
        under DDP, whose gradients are averaged): its gradient against the
        two steps before (`SuccessiveGradients`, two copies kept), unscaled."""
        measured = self.successive.measure(parameters, float(size), loss_scale)
        if measured is not None:
            small, small_sq, big, big_sq = measured
            self._pending.append((small, small_sq, big, big_sq, 1.0))

    def measure(self, small: int, small_sq: torch.Tensor, big: int, big_sq: torch.Tensor,
                scale: Any) -> None:
        """Queues one measurement: the squared norms of the mean gradients
        over `small` and over `big` samples (under DDP `big` counts every
        rank's, as the averaged gradient does), both scaled by `scale` (a
        loss scale, or 1.0)."""
        self._pending.append((small, small_sq, big, big_sq, scale))

    def _flush(self) -> None:
        if not self._pending:
            return
        values = torch.stack([torch.stack([p[1].float().reshape(()), p[3].float().reshape(())])
                              for p in self._pending]).cpu().double().tolist()
        for (small, _, big, _, scale), (small_sq, big_sq) in zip(self._pending, values):
            self.noise.add(small, small_sq / scale ** 2, big, big_sq / scale ** 2)
        self._pending = []

    def trained(self, samples: int, device: Optional[torch.device] = None) -> None:
        """Counts a step's samples (all ranks'); once the first steps after
        the start or a change settled, the window times from here."""
        self._samples += samples
        if self.adapter.settles():
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            self.adapter.start_timing(self.clock(), self._samples)

    # -- deciding ----------------------------------------------------------

    def lr_at(self, step: int, lr: float) -> float:
        """`lr` (the plan's, after the last change) on its way from the
        previous one over `ADAPT_LR_RAMP_STEPS` steps."""
        ramp = _core.ADAPT_LR_RAMP_STEPS
        if self.ramp_start < 0 or step >= self.ramp_start + ramp:
            return lr
        return self.ramp_from + (lr - self.ramp_from) * (step - self.ramp_start + 1) / ramp

    def decide(self, step: int, plan: Any, device: torch.device) -> Optional[Dict[str, Any]]:
        """After optimizer step `step`: times the window, and rank 0 decides for all."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.adapter.end_window(plan.global_batch_size, self.clock(), self._samples)
        self._flush()
        change = None
        if _distributed.rank(self.group) == 0:
            change = self.adapter.decide_on(step, plan.global_batch_size, self.noise)
        if _distributed.world_size(self.group) > 1:
            # Rank 0 decides for all (the ranks' noise estimates differ a little).
            change = _distributed.broadcast_object(change, self.group)
        return change

    def restart_window(self) -> None:
        """The next window times from now: a change took effect later than
        the decision (a loader that asks ahead), and the window times one size."""
        self.adapter.restart_window(self.clock(), self._samples)

    def apply(self, change: Dict[str, Any], step: int, current_lr: float) -> None:
        self.ramp_from = current_lr
        self.ramp_start = step
        self.schedule.append(change)

    # -- checkpoints -------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        self._flush()
        return dict(schedule=[dict(c) for c in self.schedule], policy=self.adapter.state(),
                    noise=self.noise.state(), ramp_from=self.ramp_from,
                    ramp_start=self.ramp_start, successive=self.successive.state())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.schedule = [dict(c) for c in state["schedule"]]
        self.adapter.load_state(state["policy"])
        self.noise.load_state(state["noise"])
        self.ramp_from = state["ramp_from"]
        self.ramp_start = state["ramp_start"]
        # The gradient kept to measure the next step against (none in a
        # state saved before it was kept).
        self.successive.load_state(state.get("successive"))
        self.adapter.restart_window(self.clock(), self._samples)


class AdaptiveBatchSampler:
    """Batches of indices for `DataLoader(dataset, batch_sampler=...)` at the
    size a `Trainer(adapt=True)` trains at the moment: each batch is the next
    `trainer.batch_size` samples of the epoch's order (this rank's share of
    the global batch under torch.distributed), so a change of the batch takes
    effect at the next batch the loader asks for, without restarting the
    epoch or skipping a sample. An epoch ends where fewer than a batch are
    left; those are dropped, as `drop_last` does. Each epoch's order is drawn
    from (`seed`, epoch), so a resumed run (`state_dict`) sees the same order.

    With `num_workers` > 0 the loader asks for batches ahead of time
    (`prefetch_factor` per worker): a change then reaches the batches asked
    for after it, and the ones already asked for train at the old size, whole.

    Example::

        trainer = batchtune.Trainer(model, optimizer, loss_fn, plan, adapt=True)
        sampler = batchtune.AdaptiveBatchSampler(len(dataset), trainer, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
        for epoch in range(3):
            for batch in loader:
                trainer.step(batch)
    """

    def __init__(self, dataset_size: int, trainer: Any, shuffle: bool = True, seed: int = 0):
        if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
            raise _core.Error(f"dataset_size: give the number of samples (an int of at least 1), "
                              f"got {dataset_size!r}")
        self.dataset_size = dataset_size
        self.trainer = trainer
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        world = trainer.plan.world_size
        self.rank = _distributed.rank(trainer.group)
        self.world = world

    def _order(self, epoch: int) -> List[int]:
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch + 1)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def __iter__(self) -> Iterator[List[int]]:
        order = self._order(self.epoch)
        while True:
            size = self.trainer.plan.global_batch_size
            if self.dataset_size - self.offset < size:
                break
            batch = order[self.offset:self.offset + size]
            self.offset += size
            yield batch[self.rank::self.world]
        self.epoch += 1
        self.offset = 0

    def __len__(self) -> int:
        """Batches left in this epoch at the size of the moment."""
        return (self.dataset_size - self.offset) // self.trainer.plan.global_batch_size

    def state_dict(self) -> Dict[str, int]:
        return dict(epoch=self.epoch, offset=self.offset, seed=self.seed)

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.seed = int(state["seed"])

