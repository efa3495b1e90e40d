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


# What each adapt count is, with its bounds: the CLI's (`--adapt-every`,
# `--adapt-max-batch`, `--adapt-min-batch`), the policy's own check taking the
# values in range.
_COUNTS = {
    "adapt_every": (1, "optimizer steps"),
    "adapt_max_batch": (0, f"samples (None or 0: {_core.DEFAULT_ADAPT_GROWTH} x the starting "
                           "batch)"),
    "adapt_min_batch": (0, f"samples (None or 0: the starting batch / "
                           f"{_core.DEFAULT_ADAPT_GROWTH})"),
}


def _count(name: str, value: Any) -> int:
    """An adapt count as an int (`TypeError` for a bool or a float), refused
    past `_checks.MAX_PLAN_COUNT` either way (a typo, and past what the
    policy's int64 takes); one in reach goes to the policy's own check."""
    value = _checks.whole(name, value)
    if abs(value) > _checks.MAX_PLAN_COUNT:
        low, what = _COUNTS[name]
        raise _core.Error(f"{name}: must be in [{low}, {_checks.MAX_PLAN_COUNT}] {what}, "
                          f"got {value}")
    return value


def check_arguments(every: Any, max_global_batch: Any, lr: Any = "gain",
                    min_global_batch: Any = None) -> None:
    """`adapt_every`, `adapt_max_batch`, `adapt_lr` and `adapt_min_batch` of a
    `Trainer` or the Lightning callback, before anything runs: whole numbers
    (a `TypeError` otherwise), in the policy's own range
    (`check_adapt_options`) and at most `_checks.MAX_PLAN_COUNT`; None or 0
    for the largest or smallest batch is the default; the lr rule "gain" or
    "batch"."""
    _count("adapt_every", every)
    if not isinstance(lr, str):
        raise TypeError(f"adapt_lr: must be \"gain\" or \"batch\" (a str), got {lr!r}")
    if max_global_batch is not None:
        _count("adapt_max_batch", max_global_batch)
    if min_global_batch is not None:
        _count("adapt_min_batch", min_global_batch)
    _core.check_adapt_options(every, max_global_batch or 0, lr, min_global_batch or 0)


def adapt_arguments(adapt: Any, every: Any, max_global_batch: Any, lr: Any,
                    min_global_batch: Any) -> Tuple[int, str]:
    """`adapt` and the arguments that tune it, as a `Trainer` or the Lightning
    callback takes them: `adapt` True or False (a `TypeError` otherwise:
    "no" is no off switch); `adapt_every`, `adapt_max_batch`,
    `adapt_min_batch` and `adapt_lr` only with `adapt=True`, as `train
    --adapt-every` and the rest only with `--adapt`; then `check_arguments`.
    Returns `adapt_every` (None: `DEFAULT_ADAPT_EVERY`) and the lr rule
    (None: "gain")."""
    if not isinstance(adapt, bool):
        raise TypeError(f"adapt: must be True or False, got {adapt!r}")
    given = (("adapt_every", every), ("adapt_max_batch", max_global_batch),
             ("adapt_min_batch", min_global_batch), ("adapt_lr", lr))
    if not adapt:
        for name, value in given:
            if value is not None:
                raise _core.Error(f"{name}: tunes adapt; give adapt=True, or leave it out")
        return _core.DEFAULT_ADAPT_EVERY, "gain"
    every = _core.DEFAULT_ADAPT_EVERY if every is None else every
    lr = "gain" if lr is None else lr
    check_arguments(every, max_global_batch, lr, min_global_batch)
    return every, lr


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

    def load_state_dict(self, state: Dict[str, Any], name: str = "state_dict['adapt']") -> None:
        """`state_dict()`'s state, checked first (`name` says where it came
        from): a missing field or a wrong type is refused naming it, and
        nothing changes where a part does not load."""
        if not isinstance(state, Mapping):
            raise TypeError(f"{name}: must be the dict state_dict() returned, got "
                            f"{type(state).__name__}")
        for key in ("schedule", "policy", "noise", "ramp_from", "ramp_start"):
            if key not in state:
                raise _core.Error(f"{name}: has no '{key}'; give the dict state_dict() returned")
        schedule = state["schedule"]
        if not isinstance(schedule, (list, tuple)) or not schedule or \
                not all(isinstance(c, Mapping) for c in schedule):
            raise TypeError(f"{name}['schedule']: must be the list of changes (dicts) "
                            f"state_dict() returned, got {schedule!r:.60}")
        for key in ("policy", "noise"):
            if not isinstance(state[key], str):
                raise TypeError(f"{name}['{key}']: must be the JSON text state_dict() returned, "
                                f"got {type(state[key]).__name__}")
        ramp_from = _checks.number(f"{name}['ramp_from']", state["ramp_from"], "an lr")
        ramp_start = _checks.integer(f"{name}['ramp_start']", state["ramp_start"], -1)
        # The gradient kept to measure the next step against (none in a
        # state saved before it was kept).
        successive = state.get("successive")
        kept = (self.adapter.state(), self.noise.state(), self.successive.state())
        try:
            for key, part, value in (("policy", self.adapter, state["policy"]),
                                     ("noise", self.noise, state["noise"]),
                                     ("successive", self.successive, successive)):
                try:
                    part.load_state(value)
                except _core.Error:  # the part's own words (a resume by another rule)
                    raise
                except (RuntimeError, TypeError, ValueError, KeyError) as e:
                    why = str(e).splitlines()[0] if str(e) else type(e).__name__
                    raise _core.Error(f"{name}['{key}']: does not load ({why}); give the dict "
                                      "state_dict() returned") from None
        except _core.Error:
            for part, value in zip((self.adapter, self.noise, self.successive), kept):
                part.load_state(value)
            raise
        self.schedule = [dict(c) for c in schedule]
        self.ramp_from = ramp_from
        self.ramp_start = ramp_start
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
    A data set smaller than the global batch is refused: no epoch of it would
    train a step.

    With `num_workers` > 0 the loader asks for batches ahead of time
    (`prefetch_factor` per worker): a change then reaches the batches asked
    for after it, and the ones already asked for train at the old size, whole.
    `state_dict()` is where the training stands, not the loader: the batches
    the trainer stepped on (one `trainer.step` a batch), so that a resume
    hands out again those the loader had fetched and the training had not
    reached.

    Example::

        trainer = batchtune.Trainer(model, optimizer, loss_fn, plan, adapt=True)
        sampler = batchtune.AdaptiveBatchSampler(len(dataset), trainer, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2)
        for epoch in range(3):
            for batch in loader:
                trainer.step(batch)
                torch.save(dict(trainer=trainer.state_dict(),
                                sampler=sampler.state_dict()), "resume.pt")
    """

    def __init__(self, dataset_size: int, trainer: Any, shuffle: bool = True, seed: int = 0):
        if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
            raise _core.Error(f"dataset_size: give the number of samples (an int of at least 1), "
                              f"got {dataset_size!r}")
        plan = getattr(trainer, "plan", None)
        if not isinstance(getattr(plan, "global_batch_size", None), int) or \
                not hasattr(trainer, "group"):
            raise TypeError(f"trainer: give the batchtune.Trainer that trains on the batches "
                            f"(Trainer(..., adapt=True)), got {type(trainer).__name__}")
        if dataset_size < plan.global_batch_size:
            raise _core.Error(f"dataset_size: {dataset_size} samples are fewer than the global "
                              f"batch of {plan.global_batch_size}, so an epoch trains no step; "
                              f"give a data set of at least {plan.global_batch_size} samples, or "
                              f"a plan with a smaller global batch")
        self.dataset_size = dataset_size
        self.trainer = trainer
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0    # of the batches handed out to the loader
        self.offset = 0
        world = plan.world_size
        self.rank = _distributed.rank(trainer.group)
        self.world = world
        # The pass under way: where it began, the trainer's steps then, and
        # where the order stands after each batch it handed out.
        self._began: Optional[Tuple[int, int, Optional[int]]] = None
        self._after: List[Tuple[int, int]] = []

    def _order(self, epoch: int) -> List[int]:
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch + 1)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def _steps(self) -> Optional[int]:
        steps = getattr(self.trainer, "steps_done", None)
        return steps if isinstance(steps, int) else None

    def __iter__(self) -> Iterator[List[int]]:
        order = self._order(self.epoch)
        self._began = (self.epoch, self.offset, self._steps())
        self._after = []
        while True:
            size = self.trainer.plan.global_batch_size
            if self.dataset_size - self.offset < size:
                break
            batch = order[self.offset:self.offset + size]
            self.offset += size
            self._after.append((self.epoch, self.offset))
            yield batch[self.rank::self.world]
        self.epoch += 1
        self.offset = 0

    def __len__(self) -> int:
        """Batches left in this epoch at the size of the moment."""
        return (self.dataset_size - self.offset) // self.trainer.plan.global_batch_size

    def _trained(self, batches_trained: Optional[int]) -> Tuple[int, int]:
        """(epoch, offset) after the first `batches_trained` batches of the
        pass under way."""
        if self._began is None:
            return self.epoch, self.offset
        epoch, offset, steps = self._began
        if batches_trained is None:
            now = self._steps()
            if steps is None or now is None:  # no step count: the loader's place
                return self.epoch, self.offset
            batches_trained = now - steps
        if batches_trained <= 0:
            return epoch, offset
        if batches_trained >= len(self._after):
            # Every batch handed out trained: the loader's place (the next
            # epoch once the pass ended).
            return self.epoch, self.offset
        return self._after[batches_trained - 1]

    def state_dict(self, batches_trained: Optional[int] = None) -> Dict[str, int]:
        """Where the training stands in the epochs' order: after the batches
        of the pass under way that trained — by default the trainer's
        optimizer steps since the pass began (one `trainer.step` a batch);
        a loop that trains on them otherwise gives their number,
        `batches_trained`. Batches the loader fetched ahead (`num_workers` >
        0) and the training did not reach are handed out again on a resume."""
        if batches_trained is not None:
            batches_trained = _checks.integer("batches_trained", batches_trained, 0)
        epoch, offset = self._trained(batches_trained)
        return dict(epoch=epoch, offset=offset, seed=self.seed)

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(f"state: give the dict AdaptiveBatchSampler.state_dict() returned, "
                            f"got {type(state).__name__}")
        for key in ("epoch", "offset", "seed"):
            if key not in state:
                raise _core.Error(f"state: has no '{key}'; give the dict "
                                  f"AdaptiveBatchSampler.state_dict() returned")
        epoch = _checks.integer("state['epoch']", state["epoch"], 0)
        offset = _checks.integer("state['offset']", state["offset"], 0, self.dataset_size)
        seed = _checks.whole("state['seed']", state["seed"])
        self.epoch, self.offset, self.seed = epoch, offset, seed
        self._began = None
        self._after = []
