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
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint

from . import _core
from ._configuration import ConfigurationRun, Knob, choose_configuration

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


# Checkpointing's runs are configuration runs (`_configuration`).
CheckpointingRun = ConfigurationRun

# Under torch.compile, the share of the activations the compiler's
# selective checkpointing keeps (`activation_memory_budget`, 1.0 keeping
# all): its min-cut partitioner recomputes the cheapest operations
# (pointwise ones first) until what is saved fits this share. Half: the
# midpoint between whole-block recomputation (near 0) and none.
SELECTIVE_BUDGET = 0.5


def selective_budget_available() -> bool:
    """Whether the installed torch has the compiler's activation memory
    budget (`torch._functorch.config.activation_memory_budget`)."""
    config = getattr(getattr(torch, "_functorch", None), "config", None)
    return config is not None and hasattr(config, "activation_memory_budget")


def set_activation_memory_budget(budget: float) -> float:
    """Sets the compiler's activation memory budget and drops the graphs
    compiled so far (`torch._dynamo.reset()`: a compiled graph keeps the
    budget it was compiled under, and dynamo does not recompile for a
    change), so the next compile uses it. Returns the budget it replaced."""
    import torch._functorch.config as functorch_config
    before = float(functorch_config.activation_memory_budget)
    if budget != before:
        functorch_config.activation_memory_budget = budget
        torch._dynamo.reset()
    return before


class SelectiveCheckpointing:
    """Checkpointing for a compiled model: the compiler's activation memory
    budget (`SELECTIVE_BUDGET`) instead of whole blocks recomputed; `undo()`
    puts back the budget it found."""

    module_names: List[str] = []

    def __init__(self, budget: float = SELECTIVE_BUDGET):
        self.budget = budget
        self._before: Optional[float] = None

    def on(self) -> None:
        if self._before is None:
            self._before = set_activation_memory_budget(self.budget)

    def undo(self) -> None:
        if self._before is not None:
            set_activation_memory_budget(self._before)
            self._before = None


def choose_checkpointing(off: ConfigurationRun, on: ConfigurationRun,
                         objective: str) -> Tuple[bool, str]:
    """Whether the plan keeps checkpointing, and why in one sentence with
    the figures (`choose_configuration`'s rule): "checkpointing fits 9
    against 6 at 0.78x the samples/s ([0.70x, 0.86x], batch 9 against 6):
    slower beyond the measurements' spread; kept off"."""
    return choose_configuration(off, on, objective,
                                f"checkpointing fits {on.max_batch} against {off.max_batch}",
                                "kept on", "kept off", tie_note=" (it recomputes the forward pass)")


class CheckpointingKnob(Knob):
    """Checkpointing as a configuration knob: whole blocks recomputed
    (`Checkpointing`), or for a compiled model without `checkpoint_modules`,
    where the installed torch has it, the compiler's activation memory
    budget (`SelectiveCheckpointing`)."""

    name = label = "checkpointing"

    def __init__(self, model: torch.nn.Module, modules: Optional[Sequence[Any]], compiled: bool):
        self.selective = compiled and not modules and selective_budget_available()
        self.switch: Any = SelectiveCheckpointing() if self.selective else \
            Checkpointing(model, modules)

    def on(self) -> None:
        self.switch.on()

    def undo(self) -> None:
        self.switch.undo()

    def choose(self, base: ConfigurationRun, other: ConfigurationRun, objective: str):
        return choose_checkpointing(base, other, objective)

    def leave(self, kept: bool) -> None:
        # The compiler's budget is the process's, not the model's: put back
        # whatever the plan says (Trainer sets it from the plan).
        if not kept or self.selective:
            self.undo()

    def apply(self, core: Any, kept: bool, reason: str) -> None:
        if kept and self.selective:
            reason = (f"{reason}; " if reason else "") + (
                f"under torch.compile by the compiler's selective checkpointing "
                f"(activation_memory_budget {self.switch.budget:g}), not whole blocks")
        core.set_checkpointing(kept, self.switch.module_names, reason)
        if kept and self.selective:
            core.set_activation_memory_budget(self.switch.budget)
