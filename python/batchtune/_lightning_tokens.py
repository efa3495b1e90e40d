"""`BatchTune(lengths=...)`: sequences of varying length in Lightning — every
sample's length, the trials' batches at a length (the longest samples cut to
it), the train loader re-made over a `TokenBudgetSampler`, and under DDP
each rank's loss weighted by its share of the step's tokens."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader

from . import _core
from ._lengths import sequence_length
from ._step import loss_item_count
from .token_sampler import TokenBudgetSampler, pad_collate


def _cut(value: Any, length: int, tokens: int) -> Any:
    """`value` with each of its sequences of `tokens` tokens cut to `length`."""
    if isinstance(value, dict):
        return {k: _cut(v, length, tokens) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_cut(v, length, tokens) for v in value)
    if sequence_length(value) == tokens:
        return value[:length]
    if isinstance(value, list):
        return [_cut(v, length, tokens) for v in value]
    return value


class LongestCut:
    """`make_batch(n, length)` over the data set: n of the samples of at
    least `length` tokens, the longest first (repeated when there are fewer),
    each cut to `length` — real tokens in the data's own form —, then
    `collate_fn` and `convert`, as the train loader hands them to the step."""

    def __init__(self, dataset: Any, lengths: List[int], collate_fn: Callable,
                 convert: Optional[Callable[[Any], Any]] = None):
        self.dataset = dataset
        self.lengths = lengths
        self.order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        self.collate_fn = collate_fn
        self.convert = convert

    def __call__(self, n: int, length: int) -> Any:
        longer = [i for i in self.order if self.lengths[i] >= length] or self.order[:1]
        with _core.uncounted():
            samples = [_cut(self.dataset[i], length, self.lengths[i])
                       for i in (longer[k % len(longer)] for k in range(n))]
        batch = self.collate_fn(samples)
        del samples
        return self.convert(batch) if self.convert is not None else batch


def train_collate(loader: DataLoader) -> Callable:
    """The loader's own collate_fn, or `pad_collate` where it has the
    default one (which cannot stack samples of different lengths)."""
    collate = loader.collate_fn
    return pad_collate if collate is None or collate is torch.utils.data.default_collate else collate


class TokenBatches(BatchSampler):
    """The batch sampler `BatchTune(lengths=...)` puts in the train
    dataloader: the micro-batches of its `TokenBudgetSampler`. Lightning may
    make it again with a `DistributedSampler` (`sampler`) under DDP; the
    token sampler shards by rank itself, so that one is not read."""

    def __init__(self, sampler: Any = None, batch_size: int = 1, drop_last: bool = False,
                 tokens: Optional[TokenBudgetSampler] = None):
        if tokens is None:
            raise _core.Error("TokenBatches: BatchTune(lengths=...) makes it with its token sampler; "
                              "use batchtune.TokenBudgetSampler as the batch_sampler instead")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.tokens = tokens

    def __iter__(self) -> Iterator[List[int]]:
        return iter(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)


def token_loader(loader: DataLoader, tokens: TokenBudgetSampler) -> DataLoader:
    """`loader` over `tokens`: the same data set, workers and the rest, its
    collate_fn kept (`pad_collate` where it had the default one)."""
    extra: Dict[str, Any] = {}
    if loader.num_workers > 0:
        extra = dict(prefetch_factor=loader.prefetch_factor,
                     persistent_workers=loader.persistent_workers)
    for name in ("pin_memory_device", "in_order"):
        if hasattr(loader, name):
            extra[name] = getattr(loader, name)
    return DataLoader(loader.dataset, batch_sampler=TokenBatches(loader.sampler, tokens=tokens),
                      num_workers=loader.num_workers, collate_fn=train_collate(loader),
                      pin_memory=loader.pin_memory, timeout=loader.timeout,
                      worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context,
                      generator=loader.generator, **extra)


class ItemWeights:
    """Under DDP, which averages the ranks' gradients alike: each rank's
    loss (a mean over its micro-batch's items) times world × its items / all
    ranks' items, so that the averaged gradient is the per-item mean of the
    whole step — `Trainer(loss_items=...)`'s weighting. Installed as the
    module's `training_step` for the fit (the instance attribute shadows
    the method)."""

    def __init__(self, strategy: Any, world: int, module: Any, loss_items: Callable[[Any], Any]):
        self.strategy = strategy
        self.world = world
        self.module = module
        self.loss_items = loss_items
        self.original = type(module).training_step.__get__(module)

    def install(self) -> None:
        # A function, not this object: Lightning reads its __code__ to see
        # that training_step is overridden.
        def training_step(batch: Any, *args: Any, **kwargs: Any) -> Any:
            return self(batch, *args, **kwargs)

        self._installed = training_step
        self.module.__dict__["training_step"] = training_step

    def remove(self) -> None:
        installed = getattr(self, "_installed", None)
        if installed is not None and self.module.__dict__.get("training_step") is installed:
            del self.module.__dict__["training_step"]
        self._installed = None

    def weight(self, batch: Any, device: torch.device) -> torch.Tensor:
        count = loss_item_count(self.loss_items(batch))
        count = count.to(device=device, dtype=torch.float32) if isinstance(count, torch.Tensor) \
            else torch.tensor(count, device=device)
        total = self.strategy.reduce(count.clone(), reduce_op="sum")
        if not float(total) > 0:
            raise _core.Error("loss_items: the ranks' micro-batches hold 0 items in all; give steps "
                              "with something the loss averages over (a label not ignored)")
        return self.world * count / total

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        from ._lightning_tune import loss_of  # it imports this module

        out = self.original(batch, *args, **kwargs)
        if out is None:  # a batch the module skips
            return out
        loss = loss_of(out)
        scaled = loss * self.weight(batch, loss.device).to(loss.dtype)
        if isinstance(out, dict):
            return dict(out, loss=scaled)
        return scaled
