"""The plan in your loop: a small runner that trains with it."""
from __future__ import annotations

import dataclasses
import gc
import math
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from . import _checks, _core, _distributed
from ._adapt import Adaptation, adapt_arguments, loss_scale_of
from ._configuration import apply_configuration
from ._data_parallel import average_gradients, ddp_of, group_of
from ._sharded import PeerMeetings, is_sharded, sharded_modules
from ._sharded import reset as reset_sharded
from ._memory import oom_count
from ._memory_format import to_memory_format
from ._step import (LossFn, TrainStep, batch_size_of, check_amp_device, loss_item_count,
                    slice_batch, to_device)
from .plan import Plan, group_lr_ratios

# Samples [begin, end) of a batch: one forward and backward of a step.
_Piece = Tuple[Any, int, int]


class Trainer:
    """Runs a plan in your training loop: each `step(batch)` takes the samples
    of one optimizer step on this process (`plan.batch_size`, i.e. micro-batch
    × accumulation, as `plan.dataloader_kwargs()` loads them), splits them into
    micro-batches, accumulates their gradients with each loss weighted by its
    share of the batch, and steps the optimizer once.
    `step(micro_batches=[...])` takes the step's micro-batches as they come
    instead (a token-budget batch sampler's: each of its own sample count and
    padded length) and accumulates them into one optimizer step; ranks may
    give different numbers of them.

    - Under `DistributedDataParallel` the ranks cannot fall out of step:
      every micro-batch runs on its rank alone (`no_sync()`), the ranks agree
      that none ran out of memory, and only then are the gradients averaged,
      once a step, over the model's process group (rank 0's buffers handed to
      all, as DDP's forward does). An out-of-memory on one rank, anywhere in
      a step, makes every rank run the same samples again in smaller pieces;
      no collective is left waiting for a peer. The average is one
      all-reduce per parameter after the backward, not overlapped with it as
      DDP's buckets are.

    - The weighting: by default a micro-batch's loss counts by its share of
      the step's samples. That is the whole step's gradient for a loss that
      is a mean over samples, and wrong for one that averages over anything
      else, such as a per-token mean over sequences whose token counts
      differ (a Hugging Face causal LM's loss). `loss_items=fn` says what the
      loss averages over: `fn(batch)` is the number of items (an int or a
      0-dim tensor) in `batch`'s mean, e.g. its label tokens; each
      micro-batch then counts by its items over the step's, and the
      accumulated gradient and the returned loss are the whole step's
      per-item mean. Under `torch.distributed` with a
      `DistributedDataParallel` model, which averages the ranks' gradients,
      the step's items are all ranks' (summed over the group), so the
      gradient is the global batch's. A micro-batch with no items runs with
      weight 0 (its loss must still give a finite gradient, as
      `F.cross_entropy(ignore_index=-100)` does); a step with none at all
      raises `batchtune.Error`.

    - The learning rate of every parameter group follows the plan: its
      `lr` (relative to the groups' lrs when the Trainer was made, the first
      group not at lr 0 taking the plan's) with the linear warm-up of
      `warmup_steps`; a group at lr 0 (frozen) stays at 0.
    - `amp` bf16 or fp16 runs the forward under `torch.autocast`; fp16 with a
      `torch.amp.GradScaler`.
    - An out-of-memory in a micro-batch frees what the step held, halves the
      micro-batch and runs the same samples again: the logical batch (and so
      the learning rate) stays; with `micro_batches=` each given micro-batch
      runs in twice as many pieces (`micro_batch_split`) instead. Under
      `torch.distributed` every rank learns of it and halves together. An
      error that is no `torch.OutOfMemoryError` counts when the allocator
      counted a refusal during the step or its message names one ("CUDA
      error: out of memory").

    - `adapt=True` follows the gradient noise scale as training goes, by the
      policy of `batchtune train --adapt`: every `adapt_every` steps the
      global batch may double or halve where goodput (throughput measured
      here x statistical efficiency) says so, up to `adapt_max_batch`
      (default 32x the plan's) and down to `adapt_min_batch` (default the
      plan's / 32; the plan's own to never go below it), the lr following the plan's scaling rule,
      ramped over 20 steps, applied to the AdaScale gain (`adapt_lr="gain"`,
      the default) or to the batch ratio alone (`adapt_lr="batch"`, as
      `train --adapt-lr batch`). A global batch not yet run is tried for
      one window where it might win; with `adapt_speeds` (samples/s by
      global batch, as a tune measured them with their intervals:
      `result.speed_profile()`) only where the tune's speed ratio, at the
      hopeful end of its interval, says it can, as `train --adapt` after
      its quick tune. The noise scale comes
      from what the step computes anyway (the first micro-batch against the
      whole batch), or, without accumulation, each step against the two
      before it (two copies of the gradients kept).
      Feed it with an `AdaptiveBatchSampler`, which hands out the next
      `plan.batch_size` samples; `batch_schedule` lists the changes, and
      `state_dict()`/`load_state_dict()` carry them over a resume.

    This is the step the trials of `batchtune.tune` time.

    Example::

        trainer = batchtune.Trainer(model, optimizer, loss_fn, result.plan)
        loader = DataLoader(dataset, shuffle=True, **result.plan.dataloader_kwargs())
        for batch in loader:
            loss = trainer.step(batch)

    A causal LM's per-token mean loss over micro-batches of a token budget::

        trainer = batchtune.Trainer(model, optimizer, loss_fn, plan,
                                    loss_items=lambda b: (b["labels"][:, 1:] != -100).sum())
        for micro_batches in steps:  # each a list of padded batches
            loss = trainer.step(micro_batches=micro_batches)
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 plan: Plan, *, device: Optional[torch.device] = None, group: Optional[Any] = None,
                 scale_lr: bool = True, adapt: bool = False,
                 adapt_every: Optional[int] = None,
                 adapt_max_batch: Optional[int] = None, adapt_lr: Optional[str] = None,
                 adapt_min_batch: Optional[int] = None,
                 adapt_speeds: Optional[Mapping[int, Any]] = None,
                 clock: Callable[[], float] = time.perf_counter,
                 loss_items: Optional[Callable[[Any], Any]] = None):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: must be a batchtune.Plan (result.plan, Plan.make(...) or "
                            f"Plan.load(path)), got {type(plan).__name__}")
        # adapt and what tunes it, before anything is made: adapt_every and the
        # rest only with adapt=True.
        adapt_every, lr_rule = adapt_arguments(adapt, adapt_every, adapt_max_batch, adapt_lr,
                                               adapt_min_batch)
        if plan.micro_batch_size < 1 or plan.accumulation_steps < 1:
            raise _core.Error("plan: micro_batch_size and accumulation_steps must be at least 1")
        if loss_items is not None and not callable(loss_items):
            raise TypeError("loss_items: must be a function fn(batch) -> the number of items the "
                            f"loss of batch averages over, got {type(loss_items).__name__}")
        self.loss_items = loss_items
        self.model = model
        self.optimizer = optimizer
        # An adapting run changes its plan as it goes: its own copy.
        self.plan = dataclasses.replace(plan) if adapt else plan
        # The group the ranks agree and average over: a DDP model's own unless
        # one is given.
        self.group = group_of(model, group)
        if device is None:
            p = next(model.parameters(), None)
            device = p.device if p is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.micro_batch_size = plan.micro_batch_size
        # step(micro_batches=): the pieces each micro-batch runs in; an
        # out-of-memory doubles it, as it halves micro_batch_size.
        self.micro_batch_split = 1
        self.steps_done = 0
        self.recoveries: List[str] = []
        self.scale_lr = scale_lr
        # The groups' lrs relative to the first one not at 0: the plan's lr is
        # that group's; a group at lr 0 is frozen and stays at 0.
        self._lr_ratios = group_lr_ratios([float(g["lr"]) for g in optimizer.param_groups])
        check_amp_device(plan.amp, self.device)
        apply_configuration(model, plan)  # checkpointing, memory format
        self._step = TrainStep(model, optimizer, loss_fn, self.device, plan.amp)
        # An FSDP2 model on several ranks: its forward and backward gather and
        # reduce-scatter, so its FSDP modules meet the other ranks first, and
        # an out-of-memory on one rank is agreed there (`_sharded`).
        self._lockstep = None
        if is_sharded(model) and _distributed.active(self.group):
            if adapt:
                raise _core.Error("adapt: not yet with an FSDP2 (fully_shard) model; train it "
                                  "with the plan as it is, or adapt a DDP one")
            self._lockstep = _core.GroupLockstep(
                _distributed.communicator(self.group, self.device))
            self._meetings = PeerMeetings(model, self._lockstep)
        self._adapt: Optional[Adaptation] = None
        if adapt_speeds is not None and not adapt:
            raise _core.Error("adapt_speeds: guides adapt; give adapt=True, or leave it out")
        if adapt:
            if not scale_lr:
                raise _core.Error("adapt: moves the lr with the batch, which scale_lr=False "
                                  "turns off; drop one of them")
            self._adapt = Adaptation(self.plan, adapt_every, adapt_max_batch, clock, group,
                                     lr_rule, adapt_min_batch, adapt_speeds)

    @property
    def batch_schedule(self) -> List[Dict[str, Any]]:
        """`adapt=True`: one entry per change of the global batch (the first the
        start): step, global_batch_size, micro_batch_size, accumulation_steps, lr,
        noise_scale, reason. Empty without adapt."""
        return [dict(c) for c in self._adapt.schedule] if self._adapt is not None else []

    @property
    def noise_scale(self) -> Optional[float]:
        """`adapt=True`: the gradient noise scale measured so far (None before)."""
        if self._adapt is None:
            return None
        self._adapt._flush()
        return self._adapt.noise.noise_scale()

    @property
    def scaler(self) -> Optional["torch.amp.GradScaler"]:
        return self._step.scaler

    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        if self._adapt is not None:
            return _core.scheduled_lr(self._adapt.lr_at(self.steps_done, self.plan.lr),
                                      self.plan.warmup_steps, self.steps_done)
        return self.plan.lr_at(self.steps_done)

    def _apply_lr(self) -> None:
        if not self.scale_lr:
            return
        lr = self.lr()
        for group, ratio in zip(self.optimizer.param_groups, self._lr_ratios):
            group["lr"] = lr * ratio

    def _pieces(self, batches: List[Any], whole: bool, n: int,
                small: int) -> Tuple[List[_Piece], int]:
        """The step's samples in the pieces that run one at a time, and the
        samples of the first when it is measured alone (`small`, else 0).
        `step(batch)`: micro-batches of `micro_batch_size`, the first `small`
        samples alone first; `step(micro_batches=)`: each micro-batch of m
        samples in pieces of ceil(m / `micro_batch_split`)."""
        if whole:
            micro = min(self.micro_batch_size, n)
            small = min(small, micro) if small < n else 0
            bounds = [0, small] if small > 0 else [0]
            bounds += list(range(bounds[-1] + micro, n, micro)) + [n]
            return [(batches[0], b, e) for b, e in zip(bounds, bounds[1:])], small
        pieces = []
        for batch in batches:
            m = batch_size_of(batch)
            size = -(-m // self.micro_batch_split)
            pieces += [(batch, b, min(b + size, m)) for b in range(0, m, size)]
        return pieces, 0

    def _items(self, parts: List[Any]) -> List[float]:
        """`loss_items` of each part, read back from the device at once."""
        counts = []
        for part in parts:
            count = loss_item_count(self.loss_items(part))
            counts.append(count.double() if isinstance(count, torch.Tensor) else count)
        tensors = [c for c in counts if isinstance(c, torch.Tensor)]
        read = iter(torch.stack([t.to(tensors[0].device) for t in tensors]).tolist()
                    if tensors else [])
        values = [next(read) if isinstance(c, torch.Tensor) else float(c) for c in counts]
        for value in values:
            if not value >= 0:
                raise _core.Error(f"loss_items: returned {value} for a micro-batch; it counts the "
                                  "items its loss averages over, at least 0")
        return values

    def _weights(self, pieces: List[_Piece], n: int) -> Tuple[List[float], List[float]]:
        """Each piece's weight in the step's gradient and its share of the
        step's mean loss: its samples over the step's `n`, or with
        `loss_items` its items over the step's. Under DDP, which averages the
        ranks' gradients, the weights are items x world size over all ranks'
        items, so that the average is the global batch's gradient; the loss
        stays this rank's mean."""
        if self.loss_items is None:
            shares = [(end - begin) / n for _, begin, end in pieces]
            return shares, shares
        items = self._items([slice_batch(batch, begin, end) for batch, begin, end in pieces])
        local = sum(items)
        world, total = 1, local
        if ddp_of(self.model) is not None or self._lockstep is not None:
            world = _distributed.world_size(self.group)
            total = _distributed.all_sum(local, self.group, self.device)
        if not total > 0:
            raise _core.Error("loss_items: the step's micro-batches hold 0 items in all; give "
                              "steps with something the loss averages over (a label not ignored)")
        # A rank without items has no mean loss of its own: nan, not 0.
        shares = [i / local for i in items] if local > 0 else [math.nan] * len(items)
        return [i * world / total for i in items], shares

    def _accumulate(self, pieces: List[_Piece], weights: List[float], shares: List[float],
                    small: int = 0) -> Tuple[torch.Tensor, Optional[float]]:
        """This rank's gradients of the step, piece by piece, each piece's loss
        weighted by its weight (a DDP model's not yet averaged); returns the
        step's mean loss and, with `small` > 0, the squared gradient norm of
        the first piece (`small` samples) alone, for the noise scale."""
        total = torch.zeros((), device=self.device)
        small_sq = None
        for i, ((batch, begin, end), weight, share) in enumerate(zip(pieces, weights, shares)):
            part = slice_batch(batch, begin, end)
            if self._lockstep is not None:  # FSDP2 reduce-scatters at the last piece alone
                sharded_modules(self.model)[0].set_requires_gradient_sync(i + 1 == len(pieces))
            loss = self._step.backward(part, weight)
            if share != 0:  # a piece without items may have a nan loss
                total += loss.float() * share
            del part, loss
            if small > 0 and i == 0 and weight > 0:
                # The gradient so far is weight x the first samples' mean gradient.
                small_sq = _core.squared_gradient_norm(list(self.model.parameters())) / weight ** 2
        return total, small_sq

    def _step_batches(self, batch: Any, micro_batches: Optional[Iterable[Any]]) -> List[Any]:
        """The step's batch, or its micro-batches, on the device; refuses an
        empty one."""
        if (batch is None) == (micro_batches is None):
            raise TypeError("Trainer.step: give the step's samples once, as step(batch) or as "
                            "step(micro_batches=[...]); got "
                            + ("both" if batch is not None else "neither"))
        if micro_batches is None:
            batch = to_memory_format(
                to_device(batch, self.device, non_blocking=self.plan.pin_memory),
                self.plan.memory_format)
            if batch_size_of(batch) < 1:
                raise ValueError("Trainer.step: the batch is empty")
            return [batch]
        if self._adapt is not None:
            raise _core.Error("micro_batches: adapt=True takes step(batch) of the plan's batch "
                              "size (as AdaptiveBatchSampler hands it out), not micro_batches=")
        if isinstance(micro_batches, (torch.Tensor, dict)):
            raise TypeError("micro_batches: must be a list of batches (each a tensor, a tuple/list "
                            f"or a dict of tensors), got one {type(micro_batches).__name__}")
        batches = [to_memory_format(to_device(b, self.device, non_blocking=self.plan.pin_memory),
                                    self.plan.memory_format)
                   for b in micro_batches]
        if not batches:
            raise ValueError("Trainer.step: micro_batches is empty")
        for i, b in enumerate(batches):
            if batch_size_of(b) < 1:
                raise ValueError(f"Trainer.step: micro_batches[{i}] is empty")
        return batches

    def _recover(self, pieces: List[_Piece], whole: bool, n: int, message: str) -> None:
        """After an out-of-memory all ranks agree on: the same samples in
        smaller pieces next time (the micro-batch halved, or each given
        micro-batch in twice as many pieces), noted."""
        largest = max(end - begin for _, begin, end in pieces)
        if largest <= 1:
            raise torch.OutOfMemoryError(
                f"batchtune.Trainer: out of memory at micro-batch 1, nothing left to halve "
                f"({message})")
        if whole:
            self.micro_batch_size = max(1, largest // 2)
            if self._adapt is not None:
                self._adapt.adapter.cap_micro_batch(self.micro_batch_size)
            now = f"micro-batch {self.micro_batch_size}"
        else:
            self.micro_batch_split *= 2
            now = f"each micro-batch in {self.micro_batch_split} pieces"
        note = (f"step {self.steps_done}: out of memory at micro-batch {largest} ({message}); "
                f"{now}, the logical batch {n} kept")
        self.recoveries.append(note)
        print(f"batchtune: {note}", file=sys.stderr)

    def step(self, batch: Any = None, *, micro_batches: Optional[Iterable[Any]] = None) -> float:
        """One optimizer step over `batch` (any number of samples; normally
        `plan.batch_size`), or over `micro_batches`, a list of batches as
        `step` takes them (each of its own samples and padded length, as a
        token-budget batch sampler yields them) run as they are. Returns the
        step's mean loss: by samples, or by `loss_items` when the Trainer has
        it.

        Example::

            trainer.step(micro_batches=[collate(seqs[:1]), collate(seqs[1:4])])
        """
        whole = micro_batches is None
        batches = self._step_batches(batch, micro_batches)
        n = sum(batch_size_of(b) for b in batches)
        self._apply_lr()
        while True:
            small = self._adapt.small_batch(n, min(self.micro_batch_size, n)) \
                if self._adapt is not None else 0
            pieces, first = self._pieces(batches, whole, n, small)
            weights, shares = self._weights(pieces, n)
            total, small_sq = None, None
            self._step.zero_grad()
            if self._lockstep is not None:
                self._lockstep.begin_trial(n)
            result, oom = self._out_of_memory_kept(
                lambda: self._accumulate(pieces, weights, shares, first))
            failed = self._agree(oom is not None)
            if not failed:
                total, small_sq = result
                result = None
                average_gradients(self.model)
                if self._adapt is None:
                    break
                # adapt without accumulation keeps two copies of the gradients,
                # memory no trial measured: an out-of-memory making them is the
                # step's, recovered as one in a micro-batch (the halved
                # micro-batch then accumulates, and measures without copies).
                copies = self.micro_batch_size >= n
                _, oom = self._out_of_memory_kept(lambda: self._measure_noise(n, first, small_sq))
                if not (copies and self._agree(oom is not None)):
                    if oom is not None:
                        raise oom
                    break
                self._adapt.successive.reset()
            message = str(oom).split("\n", 1)[0] if oom is not None else "on another rank"
            if oom is not None:
                oom.__traceback__ = None
            del oom, total, result
            self._step.zero_grad()
            reset_sharded(self.model)  # FSDP2 as at the end of a step, on every rank
            gc.collect()
            if torch.cuda.is_available() and self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._recover(pieces, whole, n, message)
        self._step.optimizer_step()
        self.steps_done += 1
        if self._adapt is not None:
            self._adapt_batch(n)
        return float(total)

    def _out_of_memory_kept(self, fn: Callable[[], Any]) -> Tuple[Any, Optional[BaseException]]:
        """`(fn(), None)`, or `(None, the error)` where fn ran out of memory:
        a `torch.OutOfMemoryError`, or an error under another name ("CUDA
        error: out of memory" as a RuntimeError or AcceleratorError, cuDNN's
        engine search after the allocator refused its workspace) that the
        allocator's counter or the message says is one, as in the trials."""
        ooms_before = oom_count(self.device)
        try:
            return fn(), None
        except torch.OutOfMemoryError as e:
            return None, e
        except Exception as e:  # noqa: BLE001 - an out-of-memory under another name?
            if _core.classify_failure(str(e), ooms_before, oom_count(self.device)) != "out_of_memory":
                raise
            return None, e

    def _agree(self, failed: bool) -> bool:
        """Whether any rank's step failed, known to every rank: one all-reduce,
        or for an FSDP2 model the lockstep's meeting (a failure learned at a
        meeting inside the step is not sent again)."""
        if self._lockstep is None:
            return _distributed.any_rank(failed, self.group, self.device)
        if failed:
            self._lockstep.fail()
            return True
        return not self._lockstep.check_peers()

    def _measure_noise(self, n: int, small: int, small_sq: Optional[float]) -> None:
        """adapt: the step's (global, averaged) gradient against its first
        `small` samples' (`small_sq`), or without accumulation against the
        steps before."""
        world = _distributed.world_size(self.group) if ddp_of(self.model) is not None else 1
        scaler = self._step.scaler
        if small_sq is not None:
            # The first piece ran on this rank alone; the step's gradient is
            # every rank's.
            self._adapt.measure(small, small_sq, n * world,
                                _core.squared_gradient_norm(list(self.model.parameters())),
                                scaler.get_scale() if scaler is not None else 1.0)
        if self.micro_batch_size >= n:  # no accumulation: this step against the previous one
            self._adapt.measure_successive(list(self.model.parameters()), n * world,
                                           loss_scale_of(scaler))
        else:
            self._adapt.successive.reset()

    def _adapt_batch(self, n: int) -> None:
        """Counts the step's samples and, every `adapt_every` steps, decides."""
        self._adapt.trained(n * _distributed.world_size(self.group), self.device)
        if self.steps_done % self._adapt.every != 0:
            return
        change = self._adapt.decide(self.steps_done, self.plan, self.device)
        if change is None:
            return
        lr_now = self._adapt.lr_at(self.steps_done, self.plan.lr)
        before = self.plan.global_batch_size
        self.plan.global_batch_size = change["global_batch_size"]
        self.plan.micro_batch_size = change["micro_batch_size"]
        self.plan.accumulation_steps = change["accumulation_steps"]
        self.plan.lr = change["lr"]
        self.micro_batch_size = change["micro_batch_size"]
        self._adapt.apply(change, self.steps_done, lr_now)
        if _distributed.rank(self.group) == 0:
            print(f"batchtune: step {self.steps_done}: global batch {before} -> "
                  f"{change['global_batch_size']}, lr {change['lr']:.3g}: {change['reason']}",
                  file=sys.stderr)

    def state_dict(self) -> Dict[str, Any]:
        """Where the run stands, for a checkpoint beside the model's and the
        optimizer's: the steps, the micro-batch an out-of-memory left, and with
        adapt the plan as it stands and the schedule."""
        state: Dict[str, Any] = dict(steps_done=self.steps_done,
                                     micro_batch_size=self.micro_batch_size,
                                     micro_batch_split=self.micro_batch_split)
        if self._adapt is not None:
            state["plan"] = {k: getattr(self.plan, k) for k in (
                "global_batch_size", "micro_batch_size", "accumulation_steps", "lr")}
            state["adapt"] = self._adapt.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """`state_dict()`'s state, checked before anything changes: a missing
        field, a wrong type (`TypeError`) or a value out of range
        (`batchtune.Error`, the plan's by the plan's own rule) is refused
        naming it."""
        if not isinstance(state, Mapping):
            raise TypeError("state_dict: give the dict Trainer.state_dict() returned, got "
                            f"{type(state).__name__}")
        if ("adapt" in state) != (self._adapt is not None):
            raise _core.Error("state_dict: it was saved by a Trainer "
                              f"{'with' if 'adapt' in state else 'without'} adapt=True; "
                              "load it into one made the same way")
        for key in ("steps_done", "micro_batch_size") + (
                ("plan", "adapt") if self._adapt is not None else ()):
            if key not in state:
                raise _core.Error(f"state_dict: has no '{key}'; give the dict "
                                  "Trainer.state_dict() returned")
        steps_done = _checks.integer("state_dict['steps_done']", state["steps_done"], 0)
        micro_batch_size = _checks.integer("state_dict['micro_batch_size']",
                                           state["micro_batch_size"])
        # A state saved before step(micro_batches=) existed has no split.
        micro_batch_split = _checks.integer("state_dict['micro_batch_split']",
                                            state.get("micro_batch_split", 1))
        if self._adapt is not None:
            plan = self._checked_plan(state["plan"])
            self._adapt.load_state_dict(state["adapt"])
            for k, v in plan.items():
                setattr(self.plan, k, v)
        self.steps_done = steps_done
        self.micro_batch_size = micro_batch_size
        self.micro_batch_split = micro_batch_split

    def _checked_plan(self, saved: Any) -> Dict[str, Any]:
        """The adapted plan of a state: its four fields, whole numbers and an
        lr (types here), then the plan they make with the rest of this
        Trainer's checked by the core's rule (`Plan.from_dict`: at least 1,
        micro x accumulation x world = global, lr positive, at most 1e3)."""
        name = "state_dict['plan']"
        if not isinstance(saved, Mapping):
            raise TypeError(f"{name}: give the dict Trainer.state_dict() returned, got "
                            f"{type(saved).__name__}")
        plan = {}
        for key in ("global_batch_size", "micro_batch_size", "accumulation_steps", "lr"):
            if key not in saved:
                raise _core.Error(f"{name}: has no '{key}'; give the dict Trainer.state_dict() "
                                  "returned")
            if key == "lr":
                plan[key] = _checks.number(f"{name}['lr']", saved[key], "positive")
            else:
                plan[key] = _checks.whole(f"{name}['{key}']", saved[key])
        Plan.from_dict(dataclasses.replace(self.plan, **plan).to_dict(), name)
        return plan
