"""Activation checkpointing as a measured choice: a model's blocks recompute
their activations in the backward pass instead of keeping them, a larger
batch fitting at the cost of one more forward pass.

Turned on the way the model's own library does it — a Hugging Face model
through its `gradient_checkpointing_enable()` — or, for any other model, on
the modules of the classes the user names (`checkpoint_modules`), whose
forward then runs under PyTorch's non-reentrant `torch.utils.checkpoint`.
Everything turned on is turned off again by `undo()`, leaving the model as
it was found."""
from __future__ import annotations

import functools
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint

from . import _core

MODES = ("auto", "off", "on")


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module under a DDP wrapper or `torch.compile`'s."""
    while True:
        inner = getattr(model, "module", None) if isinstance(
            model, torch.nn.parallel.DistributedDataParallel) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _hugging_face(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "supports_gradient_checkpointing", False)) and \
        callable(getattr(model, "gradient_checkpointing_enable", None))


def _matches(module: torch.nn.Module, names: Sequence[Any]) -> bool:
    return any(module.__class__ is n if isinstance(n, type) else type(module).__name__ == n
               for n in names)


def _name(n: Any) -> str:
    return n.__name__ if isinstance(n, type) else str(n)


class Checkpointing:
    """Turns activation checkpointing on for `model` (`on()`) and off again
    (`undo()`). `modules`: the classes (or class names) whose instances
    recompute; default the model's own switch (a Hugging Face model)."""

    def __init__(self, model: torch.nn.Module, modules: Optional[Sequence[Any]] = None):
        self.model = _inner(model)
        self.modules = list(modules or [])
        for n in self.modules:
            if not isinstance(n, (str, type)):
                raise _core.Error(f"checkpoint_modules: give module classes or class names, got "
                                  f"{n!r}")
        self._wrapped: List[torch.nn.Module] = []
        self._enabled = False
        if not self.modules and not _hugging_face(self.model):
            raise _core.Error(f"checkpoint_modules: {type(self.model).__name__} has no "
                              "gradient_checkpointing_enable(); name the blocks to recompute, e.g. "
                              "checkpoint_modules=[MyBlock] (or checkpointing=\"off\")")
        if self.modules and not any(_matches(m, self.modules) for m in self.model.modules()):
            raise _core.Error(f"checkpoint_modules: no module of {type(self.model).__name__} is a "
                              f"{', '.join(_name(n) for n in self.modules)}; name classes the "
                              "model has (its repeated blocks)")

    @property
    def module_names(self) -> List[str]:
        """What the plan records: the class names, or none for the model's
        own switch."""
        return [_name(n) for n in self.modules]

    def already_on(self) -> bool:
        return not self.modules and bool(getattr(self.model, "is_gradient_checkpointing", False))

    def on(self) -> None:
        if self.modules:
            for module in self.model.modules():
                if _matches(module, self.modules) and "forward" not in module.__dict__:
                    module.forward = _recomputed(module.forward)
                    self._wrapped.append(module)
        elif not self.already_on():
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
            self._enabled = True

    def undo(self) -> None:
        for module in self._wrapped:
            del module.forward
        self._wrapped = []
        if self._enabled:
            self.model.gradient_checkpointing_disable()
            self._enabled = False


def _recomputed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing to recompute
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


class CheckpointingRun(NamedTuple):
    """One configuration's tune, as the choice reads it: its largest batch,
    its chosen one, and the chosen one's samples/s with its 95 % interval
    (None where it has none)."""
    max_batch: int
    chosen: int
    samples_per_s: float
    interval: Optional[Tuple[float, float]]


def choose_checkpointing(off: CheckpointingRun, on: CheckpointingRun,
                         objective: str) -> Tuple[bool, str]:
    """Whether the plan keeps checkpointing, and why in one sentence with
    the figures: by the measured speed of each configuration's chosen batch
    — kept only where its speed is better beyond both intervals (the ratio's
    interval all above 1), never on a difference the measurements cannot
    tell; by the largest batch for the max-fit objective; on where only it
    fits anything. A speed without an interval tells nothing: kept off."""
    fits = f"checkpointing fits {on.max_batch} against {off.max_batch}"
    if off.max_batch < 1 or off.samples_per_s <= 0:
        if on.max_batch >= 1:
            return True, f"{fits}: only with it does a batch fit; kept on"
        return False, f"{fits}: kept off"
    if on.max_batch < 1 or on.samples_per_s <= 0:
        return False, f"{fits}: kept off"
    if objective == "max-fit":
        keep = on.max_batch > off.max_batch
        return keep, f"{fits}; the plan takes the largest batch: kept {'on' if keep else 'off'}"
    ratio = on.samples_per_s / off.samples_per_s
    if on.interval is None or off.interval is None or off.interval[0] <= 0:
        return False, (f"{fits} at {ratio:.2f}x the samples/s (batch {on.chosen} against "
                       f"{off.chosen}), with no interval to judge the difference by: kept off")
    low = on.interval[0] / off.interval[1]
    high = on.interval[1] / off.interval[0]
    speed = (f"{fits} at {ratio:.2f}x the samples/s ([{low:.2f}x, {high:.2f}x], batch "
             f"{on.chosen} against {off.chosen})")
    if low > 1:
        return True, f"{speed}: faster beyond the measurements' spread; kept on"
    if high < 1:
        return False, f"{speed}: slower beyond the measurements' spread; kept off"
    return False, (f"{speed}: the measurements cannot tell them apart; kept off (it recomputes "
                   "the forward pass)")
