"""The memory format of a convolutional model as a measured choice:
channels_last (NHWC: tensor cores and oneDNN's convolutions prefer it) or
contiguous (NCHW, PyTorch's default), the weights and the batch's images
converted together.

`memory_format="auto"` tunes the model both ways and keeps channels_last
only where it measured faster (`_configuration.choose_configuration`); it
applies only to a model with `Conv2d` layers. Left out, the model is tuned
as it is: channels_last where its convolutions already are, else contiguous —
nothing converted and no second tune, so a tune costs what it did."""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import _checks, _core
from ._checkpointing import _inner
from ._configuration import ConfigurationRun, Knob, choose_configuration

MODES = ("auto", "channels_last", "contiguous")

_FORMATS = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}


def has_convolutions(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in _inner(model).modules())


def current_format(model: torch.nn.Module) -> str:
    """"channels_last" where the model's convolution weights are in it (and
    not also contiguous, as a 1x1 kernel's can be), else "contiguous"."""
    for m in _inner(model).modules():
        if isinstance(m, torch.nn.Conv2d):
            w = m.weight
            if w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous():
                return "channels_last"
    return "contiguous"


def to_memory_format(batch: Any, memory_format: str) -> Any:
    """`batch` (a tensor, or tuples, lists and dicts of them) with every 4-D
    floating-point tensor (the images) in `memory_format`; the rest as it is."""
    if memory_format == "contiguous":
        return batch
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and batch.is_floating_point():
            return batch.contiguous(memory_format=_FORMATS[memory_format])
        return batch
    if isinstance(batch, dict):
        return type(batch)((k, to_memory_format(v, memory_format)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_memory_format(v, memory_format) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_memory_format(v, memory_format) for v in batch)
    return batch


def apply_memory_format(model: torch.nn.Module, memory_format: str) -> None:
    """Converts `model`'s 4-D parameters and buffers in place (the
    optimizer's references stay valid), as a plan with `memory_format`
    trains; "contiguous" leaves a contiguous model as it is."""
    if memory_format == "channels_last" or current_format(model) != "contiguous":
        _inner(model).to(memory_format=_FORMATS[memory_format])


class MemoryFormatKnob(Knob):
    """channels_last against contiguous: `on()` converts the model to
    channels_last and the tune's batches follow; `undo()` converts it back
    to the format it was found in."""

    name = "memory_format"
    label = "channels_last"
    base_label = "contiguous"

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.found = current_format(model)
        self.active = False

    def on(self) -> None:
        apply_memory_format(self.model, "channels_last")
        self.active = True

    def off(self) -> None:
        """The base setting, contiguous (a model found channels_last converted)."""
        apply_memory_format(self.model, "contiguous")
        self.active = False

    def undo(self) -> None:
        apply_memory_format(self.model, self.found)
        self.active = self.found == "channels_last"

    def leave(self, kept: bool) -> None:
        # The model is left in the format the plan keeps.
        if kept:
            self.on()
        else:
            self.off()

    def batch(self, batch: Any) -> Any:
        return to_memory_format(batch, "channels_last") if self.active else batch

    def choose(self, base: ConfigurationRun, other: ConfigurationRun, objective: str):
        return choose_memory_format(base, other, objective)

    def apply(self, core: Any, kept: bool, reason: str) -> None:
        core.set_memory_format("channels_last" if kept else "contiguous", reason)


def choose_memory_format(contiguous: ConfigurationRun, channels_last: ConfigurationRun,
                         objective: str):
    """Whether the plan keeps channels_last, and why: "channels_last at 1.12x
    the samples/s of contiguous ([1.05x, 1.19x], batch 32 against 32): faster
    beyond the measurements' spread; kept channels_last"."""
    return choose_configuration(contiguous, channels_last, objective, "channels_last",
                                "kept channels_last", "kept contiguous", of=" of contiguous",
                                tie_note=" (PyTorch's default)")


def check_memory_format(model: torch.nn.Module, memory_format: Optional[str]) -> Optional[str]:
    """The memory format asked for, checked: None (as the model is), or one
    of `MODES`; channels_last needs a convolution to change anything."""
    if memory_format is None:
        return None
    memory_format = _checks.choice("memory_format", memory_format, MODES)
    if memory_format == "channels_last" and not has_convolutions(model):
        raise _core.Error(f"memory_format: {type(_inner(model)).__name__} has no Conv2d layers, so "
                          "channels_last would change nothing; leave it out")
    return memory_format
