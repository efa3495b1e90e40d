"""Sequences of varying length: what `tune(..., lengths=...)` and
`TokenBudgetSampler` take — every sample's length, or a (shortest, longest)
range — checked once."""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, List, Optional

import torch

from . import _core


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The lengths a tune plans for: the range, and the samples' own lengths
    where they were given (None for a bare range)."""

    shortest: int
    longest: int
    samples: Optional[List[int]] = None

    @property
    def mean(self) -> Optional[float]:
        """The samples' mean length (the samples a step of tokens holds); None
        for a bare range."""
        return _core.mean_length(self.samples) if self.samples else None


def _length(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        try:  # a 0-dim tensor or a numpy integer
            if hasattr(value, "item") and float(value.item()).is_integer():
                value = int(value.item())
        except (TypeError, ValueError):
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: every length must be a whole number of tokens, got {value!r}")
    if value < 1:
        raise _core.Error(f"{name}: every length must be at least 1 token, got {value}")
    return int(value)


def parse_lengths(lengths: Any, name: str = "lengths") -> Lengths:
    """`lengths` as a tune takes it: a `(shortest, longest)` tuple, or the
    dataset's sequence lengths (a list, array or 1-D tensor of ints, one a
    sample). Raises `TypeError` or `batchtune.Error` naming `name`."""
    if isinstance(lengths, tuple) and len(lengths) == 2:
        shortest, longest = _length(name, lengths[0]), _length(name, lengths[1])
        if shortest > longest:
            raise _core.Error(f"{name}: the range ({shortest}, {longest}) has its shortest above "
                              "its longest; give (shortest, longest)")
        return Lengths(shortest, longest)
    if hasattr(lengths, "tolist") and not isinstance(lengths, (list, tuple)):
        lengths = lengths.tolist()
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"{name}: give the dataset's sequence lengths (a list of ints, one a "
                        f"sample) or a (shortest, longest) tuple, got {type(lengths).__name__}")
    samples = [_length(name, v) for v in lengths]
    if not samples:
        raise _core.Error(f"{name}: is empty; give one length per sample of the dataset")
    return Lengths(min(samples), max(samples), samples)



def sequence_length(value: Any) -> Optional[int]:
    """Tokens in one sequence — a tensor or array of token ids (its last
    dimension) or a list of ints — or None when `value` is none."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[-1]) if value.dim() > 0 else None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return None
    shape = getattr(value, "shape", None)  # a NumPy array
    if shape is not None and not isinstance(value, (list, tuple)):
        return int(shape[-1]) if len(shape) > 0 else None
    if value and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        return len(value)
    return None


def sample_length(sample: Any, key: str = "input_ids") -> Optional[int]:
    """A sample's tokens: its `key` (`input_ids`), else its first sequence (a
    mapping's first value, a tuple's first item, the sample itself); None
    when it has none."""
    if isinstance(sample, dict) or (hasattr(sample, "keys") and hasattr(sample, "__getitem__")):
        if key in sample.keys():
            return sequence_length(sample[key])
        values = [sample[k] for k in sample.keys()]
        return sequence_length(values[0]) if values else None
    if isinstance(sample, tuple) or (isinstance(sample, list) and sample and
                                     not isinstance(sample[0], numbers.Number)):
        return sequence_length(sample[0]) if sample else None
    return sequence_length(sample)


def dataset_lengths(dataset: Any, key: str = "input_ids", source: str = "train_dataset") -> List[int]:
    """Every sample's tokens (`sample_length`), in the data set's order — what
    `lengths="auto"` reads; a `datasets.Dataset` by its column at once.
    Errors name `source`.

    Example::

        lengths = dataset_lengths(tokenized)   # [412, 37, 128, ...]
    """
    if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset) or \
            not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise _core.Error(f"{source}: the samples' lengths are read from a map-style data set "
                          "(len() and [i]); for an iterable one give lengths=[...] (one a sample)")
    column = getattr(dataset, "column_names", None)
    whole = isinstance(column, list) and key in column  # a datasets.Dataset
    lengths = []
    with _core.uncounted():  # host data, outside an emulated device's budget
        values = dataset[key] if whole else (dataset[i] for i in range(len(dataset)))
        for i, value in enumerate(values):
            n = sequence_length(value) if whole else sample_length(value, key)
            if n is None:
                raise _core.Error(f"{source}: sample {i} has no `{key}` sequence (nor a first "
                                  "sequence of token ids) to measure; give lengths=[...] (one a "
                                  "sample)")
            lengths.append(n)
    return lengths


def resolve_lengths(lengths: Any, dataset: Any) -> Any:
    """`lengths` as `tune` takes it, "auto" read from `dataset` (every
    sample's `input_ids`)."""
    if isinstance(lengths, str):
        if lengths != "auto":
            raise _core.Error(f"lengths: '{lengths}' is not \"auto\"; give \"auto\" (the train_dataset's "
                              "input_ids), the samples' lengths (a list of ints) or a (shortest, "
                              "longest) tuple")
        return dataset_lengths(dataset)
    return lengths
