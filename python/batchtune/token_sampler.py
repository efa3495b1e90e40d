"""Training by a token budget from Python: `TokenBudgetSampler` cuts each
epoch into micro-batches of at most the plan's padded tokens (the library's
`LengthBucketSampler`, as `batchtune train --data text:DIR` does) and groups
them into optimizer steps of the plan's real tokens; `pad_collate` pads a
micro-batch to its longest sample."""
from __future__ import annotations

import numbers
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

import torch

from . import _checks, _core, _distributed
from ._lengths import parse_lengths
from .plan import Plan


class TokenBudgetSampler(torch.utils.data.Sampler):
    """A batch sampler (`DataLoader(dataset, batch_sampler=sampler, ...)`)
    whose every micro-batch holds at most the plan's `token_budget` padded
    tokens (len(batch) × its longest sample): the short samples packed many
    to a micro-batch, the long ones few, each in a length bucket — the
    plan's, cut finer at the data's own length quantiles (`buckets`), so
    that a micro-batch pads little. Every index comes exactly once an epoch; `set_epoch(e)` reshuffles
    (seeded by `seed` and the epoch).

    Under `torch.distributed` (or given `num_replicas` and `rank`) the
    micro-batches are dealt to the ranks in turn, every rank the same count
    (the last round filled by repeating the epoch's first micro-batches, or
    dropped with `drop_last`), and `steps()` is the same on every rank, so
    that the ranks step together and never wait on each other.

    `group(loader)` yields the micro-batches of each optimizer step: whole
    rounds until the step's real tokens over every rank reach the plan's
    `tokens_per_step` (or `tokens_per_step` given here) — feed them to
    `Trainer.step(micro_batches=...)`.

    Example::

        result = batchtune.tune(model, opt, loss_fn, make_batch, lengths=lengths)
        sampler = batchtune.TokenBudgetSampler(lengths, result.plan)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=batchtune.pad_collate)
        trainer = batchtune.Trainer(model, opt, loss_fn, result.plan, loss_items=count_tokens)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for micro_batches in sampler.group(loader):
                trainer.step(micro_batches=micro_batches)
    """

    def __init__(self, lengths: Sequence[int], plan: Plan, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, tokens_per_step: Optional[int] = None):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: must be a batchtune.Plan, got {type(plan).__name__}")
        if plan.token_budget < 1 or not plan.length_buckets:
            raise _core.Error("plan: has no token_budget; tune with lengths=... (or load a plan "
                              "of batchtune tune --input int64:MIN..MAX)")
        seqs = parse_lengths(list(lengths) if isinstance(lengths, tuple) else lengths)
        if seqs.longest > plan.length_buckets[-1]["max_length"]:
            raise _core.Error(f"lengths: a sample of {seqs.longest} tokens is longer than the plan's "
                              f"longest bucket ({plan.length_buckets[-1]['max_length']}); tune with "
                              "these lengths, or cut the long samples")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: must be True or False, got {flag!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise TypeError(f"seed: must be a whole number of 0 or more, got {seed!r}")
        self.num_replicas = (_checks.integer("num_replicas", num_replicas, 1)
                             if num_replicas is not None else _distributed.world_size())
        self.rank = _checks.integer("rank", rank, 0) if rank is not None else _distributed.rank()
        if self.rank >= self.num_replicas:
            raise _core.Error(f"rank: must be below num_replicas ({self.num_replicas}), "
                              f"got {self.rank}")
        self.lengths = seqs.samples
        self.plan = plan
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.tokens_per_step = _checks.integer("tokens_per_step", tokens_per_step, 1) \
            if tokens_per_step is not None else \
            (plan.tokens_per_step or plan.token_budget * self.num_replicas)
        # The plan's buckets cut at the data's own length quantiles: a
        # micro-batch pads to a length near its samples' own.
        self.buckets = _core.buckets_for_lengths(
            [(b["max_length"], b["micro_batch_size"]) for b in plan.length_buckets],
            plan.token_budget, self.lengths)
        self._core = _core.LengthBucketSampler(self.lengths, self.buckets, plan.token_budget,
                                               self.seed)
        self.epoch = 0
        self._cut: Optional[tuple] = None  # (epoch, rounds, steps)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _checks.integer("epoch", epoch, 0)

    def _epoch_cut(self):
        """This epoch's rounds (one micro-batch a rank: (indices, tokens,
        padded)) and its steps (rounds a step), made once an epoch."""
        if self._cut is not None and self._cut[0] == self.epoch:
            return self._cut[1], self._cut[2]
        batches = self._core.epoch(self.epoch) if self.shuffle else \
            self._core.batches(list(range(len(self.lengths))))
        ranks = self.num_replicas
        if len(batches) % ranks:
            if self.drop_last or len(batches) < ranks:
                batches = batches[:len(batches) - len(batches) % ranks]
            else:
                batches = batches + batches[:ranks - len(batches) % ranks]
        if not batches:
            raise _core.Error(f"num_replicas: {len(self.lengths)} samples make fewer micro-batches "
                              f"than the {ranks} ranks; give more data or fewer ranks")
        steps = list(_core.steps_by_tokens(batches, self.tokens_per_step, ranks))
        if self.drop_last and len(steps) > 1:
            last = steps[-1]
            tail = batches[len(batches) - last * ranks:]
            if sum(b[1] for b in tail) < self.tokens_per_step:
                steps.pop()
                batches = batches[:len(batches) - last * ranks]
        rounds = [batches[i:i + ranks] for i in range(0, len(batches), ranks)]
        self._cut = (self.epoch, rounds, steps)
        return rounds, steps

    def __iter__(self) -> Iterator[List[int]]:
        rounds, _ = self._epoch_cut()
        for r in rounds:
            yield list(r[self.rank][0])

    def __len__(self) -> int:
        """This rank's micro-batches this epoch."""
        return len(self._epoch_cut()[0])

    def steps(self) -> List[int]:
        """The micro-batches of each optimizer step this epoch, the same on
        every rank."""
        return list(self._epoch_cut()[1])

    def padding(self) -> Dict[str, int]:
        """This epoch over every rank: `tokens` (real), `padded_tokens` and
        `micro_batches`."""
        rounds, _ = self._epoch_cut()
        flat = [b for r in rounds for b in r]
        return {"tokens": sum(b[1] for b in flat), "padded_tokens": sum(b[2] for b in flat),
                "micro_batches": len(flat)}

    def group(self, micro_batches: Iterable[Any]) -> Iterator[List[Any]]:
        """The micro-batches `micro_batches` yields (a DataLoader over this
        sampler) grouped into this epoch's optimizer steps."""
        steps = self.steps()
        it = iter(micro_batches)
        for count in steps:
            step = []
            for _ in range(count):
                try:
                    step.append(next(it))
                except StopIteration:
                    raise _core.Error("group: the loader ended before this epoch's steps did; "
                                      "give it this sampler as batch_sampler and call set_epoch "
                                      "on the sampler only") from None
            yield step


class PadCollate:
    """A `collate_fn` that pads each sequence of a micro-batch to the batch's
    longest: samples are dicts (`{"input_ids": ..., "labels": ...}`),
    tuples or single sequences of tokens (lists or 1-D tensors). `labels`
    is padded with `label_pad_value` (ignored by the loss), everything else
    with `pad_value` (an `attention_mask` with 0); non-sequence values are
    stacked."""

    def __init__(self, pad_value: int = 0, label_pad_value: int = -100):
        self.pad_value = pad_value
        self.label_pad_value = label_pad_value

    def _pad(self, values: List[Any], key: Optional[str]) -> torch.Tensor:
        tensors = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]
        if tensors[0].dim() == 0:
            return torch.stack(tensors)
        value = self.label_pad_value if key == "labels" else \
            0 if key == "attention_mask" else self.pad_value
        return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)

    def __call__(self, samples: List[Any]) -> Any:
        first = samples[0]
        if isinstance(first, dict):
            return {k: self._pad([s[k] for s in samples], k) for k in first}
        if isinstance(first, (tuple, list)) and first and not isinstance(first[0], numbers.Number):
            return type(first)(self._pad([s[i] for s in samples], None) for i in range(len(first)))
        return self._pad(samples, None)


pad_collate = PadCollate()
"""Pads each micro-batch to its longest sample (`PadCollate()` with the
defaults: tokens padded with 0, `labels` with -100)."""
