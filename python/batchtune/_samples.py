"""`make_batch` over a real data set: n samples, collated as the training's
loader collates them, the heaviest first — what the Lightning callback and
the Hugging Face helper tune with."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch

from . import _core

# Samples weighed to find the heaviest: a data set larger than this is weighed
# at this many evenly spaced indices (each weighing loads a sample).
_MAX_WEIGHED_SAMPLES = 4096


def sample_weight(sample: Any) -> int:
    """How heavy a sample is for the step: the elements of its tensors (and of
    arrays, lists and strings — a tokenized text before collation)."""
    if isinstance(sample, torch.Tensor):
        return sample.numel()
    if isinstance(sample, (str, bytes)):
        return len(sample)
    if isinstance(sample, dict) or (hasattr(sample, "keys") and hasattr(sample, "__getitem__")):
        return sum(sample_weight(sample[k]) for k in sample.keys())
    if isinstance(sample, (list, tuple)):
        if sample and all(isinstance(v, (int, float, bool)) for v in sample):
            return len(sample)
        return sum(sample_weight(v) for v in sample)
    size = getattr(sample, "size", None)  # a NumPy array
    if isinstance(size, int):
        return size
    return 1


def _is_map_style(dataset: Any) -> bool:
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return False
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


class HeaviestFirst:
    """`make_batch(n)` over `dataset`: the n heaviest samples (by
    `sample_weight`, of at most `_MAX_WEIGHED_SAMPLES` weighed; repeated when n
    is more than there are) through `collate_fn`, then `convert`.

    Example::

        make_batch = HeaviestFirst(loader.dataset, loader.collate_fn)
        batchtune.tune(model, optimizer, loss_fn, make_batch)
    """

    def __init__(self, dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]] = None,
                 convert: Optional[Callable[[Any], Any]] = None, what: str = "the data set"):
        if collate_fn is None:
            collate_fn = torch.utils.data.default_collate
        self.collate_fn = collate_fn
        self.convert = convert
        # Samples are host data: they are loaded outside the emulated device's
        # budget (a batch is counted when it is collated, as a copy on a GPU is).
        with _core.uncounted():
            if _is_map_style(dataset):
                n = len(dataset)
                if n == 0:
                    raise _core.Error(f"{what}: is empty; batchtune tunes on its samples")
                if n <= _MAX_WEIGHED_SAMPLES:
                    indices = list(range(n))
                else:
                    step = n / _MAX_WEIGHED_SAMPLES
                    indices = [int(i * step) for i in range(_MAX_WEIGHED_SAMPLES)]
                weights = [sample_weight(dataset[i]) for i in indices]
                self._dataset = dataset
                self._samples = None
            else:
                samples = []
                for sample in dataset:
                    samples.append(sample)
                    if len(samples) == _MAX_WEIGHED_SAMPLES:
                        break
                if not samples:
                    raise _core.Error(f"{what}: yields no samples; batchtune tunes on its samples")
                indices = list(range(len(samples)))
                weights = [sample_weight(s) for s in samples]
                self._dataset = None
                self._samples = samples
        # Heaviest first; equal weights keep the data set's order.
        self.order = [i for _, i in sorted(zip(weights, indices), key=lambda wi: -wi[0])]
        self.heaviest = max(weights)
        self.lightest = min(weights)
        self.size = len(dataset) if _is_map_style(dataset) else None

    def _sample(self, index: int) -> Any:
        if self._samples is not None:
            return self._samples[index]
        return self._dataset[index]

    def __call__(self, n: int) -> Any:
        with _core.uncounted():
            samples = [self._sample(self.order[i % len(self.order)]) for i in range(n)]
        batch = self.collate_fn(samples)
        del samples
        return self.convert(batch) if self.convert is not None else batch
