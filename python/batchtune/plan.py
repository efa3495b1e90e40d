"""The plan: how to train — micro-batch, accumulation, learning rate, warm-up,
precision, loader settings — under the field names of the plan JSON
(`batchtune plan --json`, the `plan` of `batchtune tune --json`)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _core
from ._memory import python_names


@dataclasses.dataclass
class Plan:
    """How to train. Fields and names as in the plan JSON.

    Example::

        plan = result.plan
        loader = torch.utils.data.DataLoader(dataset, **plan.dataloader_kwargs())
        trainer = batchtune.Trainer(model, optimizer, loss_fn, plan)
    """

    micro_batch_size: int = 1
    """Samples per forward/backward."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step."""
    world_size: int = 1
    """Processes training together."""
    global_batch_size: int = 1
    """micro_batch_size × accumulation_steps × world_size."""
    lr: float = 1e-3
    """The learning rate after warm-up."""
    lr_scaling: str = "sqrt"
    """How lr followed the global batch: linear, sqrt or none."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up."""
    amp: str = "off"
    """Mixed precision: off, bf16 or fp16."""
    workers: int = 0
    pin_memory: bool = False
    prefetch: int = 2
    eval_micro_batch_size: int = 0
    """Samples per forward-only evaluation batch (no gradients, no optimizer
    state), found by a forward-only search; 0 when none ran (evaluate at the
    micro-batch)."""
    reasons: List[str] = dataclasses.field(default_factory=list)
    """One sentence per choice, saying why and where its value came from."""
    warnings: List[str] = dataclasses.field(default_factory=list)
    """What the plan could not know and guessed (the batch the lr belongs to)."""
    workload: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """What the plan was measured on (model, input, optimizer, base_lr,
    base_batch, device, memory_limit_bytes), as the plan JSON's `workload`."""

    @property
    def batch_size(self) -> int:
        """Samples one process takes per optimizer step (micro × accumulation):
        what `Trainer.step` expects per call."""
        return self.micro_batch_size * self.accumulation_steps

    def dataloader_kwargs(self, eval: bool = False) -> Dict[str, Any]:
        """Keyword arguments of `torch.utils.data.DataLoader` for this plan.

        `batch_size` is the samples one `Trainer.step` takes (micro-batch ×
        accumulation); with `eval=True` it is the evaluation batch
        (`eval_micro_batch_size`, or the micro-batch when none was searched).
        `prefetch_factor` and `persistent_workers` only come with workers, as
        DataLoader requires.
        """
        batch_size = self.batch_size
        if eval:
            batch_size = self.eval_micro_batch_size or self.micro_batch_size
        kwargs: Dict[str, Any] = {
            "batch_size": batch_size,
            "num_workers": self.workers,
            "pin_memory": self.pin_memory,
            "prefetch_factor": self.prefetch if self.workers > 0 else None,
            "persistent_workers": self.workers > 0,
        }
        return kwargs

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: str = "plan") -> "Plan":
        """Reads and checks a plan dict, or a dict with a `plan` field (as
        `batchtune tune --json` writes); a bad field raises `batchtune.Error`."""
        checked = json.loads(_core.check_plan_json(json.dumps(data), source))
        return cls(**checked)

    @classmethod
    def load(cls, path: str) -> "Plan":
        """Reads a plan file (`batchtune plan --json` or `tune --json` output)."""
        with open(path) as f:
            text = f.read()
        return cls.from_dict(json.loads(text), path)

    @classmethod
    def make(cls, micro_batch_size: int, *, target_batch: Optional[int] = None, world_size: int = 1,
             base_lr: float = 1e-3, base_batch: Optional[int] = None, optimizer: str = "adam",
             lr_scaling: Optional[str] = None, warmup_steps: Optional[int] = None,
             amp: str = "off", workers: int = 0, pin_memory: bool = False,
             prefetch: int = 2, multiple_of: int = 1,
             speeds: Sequence[Tuple[int, float]] = (),
             tolerance: float = _core.DEFAULT_TOLERANCE) -> "Plan":
        """A plan from a micro-batch, as `batchtune plan` makes it (the C++
        `make_plan`): `target_batch` reached exactly where a micro-batch up to
        this one divides it (within `tolerance` of its speed, read from
        `speeds`, the sweep's (batch size, samples/s) rows; down to half of it
        without them), else the nearest; lr scaled from `base_lr` at
        `base_batch` (unscaled when that is None); warm-up by the rule unless
        given; the micro-batch rounded down to a multiple of `multiple_of`."""
        try:
            text = _core.make_plan(
                micro_batch_size=micro_batch_size, target_batch=target_batch or 0,
                world_size=world_size, base_lr=base_lr, base_batch=base_batch or 0,
                optimizer=optimizer, lr_scaling=lr_scaling or "",
                warmup_steps=-1 if warmup_steps is None else warmup_steps, amp=amp,
                workers=workers, pin_memory=pin_memory, prefetch=prefetch,
                multiple_of=multiple_of, speeds=[(int(b), float(s)) for b, s in speeds],
                speed_tolerance=tolerance)
        except _core.Error as e:
            raise python_names(e) from None
        return cls(**json.loads(text))

    def lr_at(self, step: int) -> float:
        """The learning rate at optimizer step `step` (from 0): linear warm-up
        to `lr`, then constant."""
        return _core.scheduled_lr(self.lr, self.warmup_steps, step)


def optimizer_kind(optimizer) -> str:
    """`sgd` for SGD-like optimizers (linear lr scaling), else `adam`/`adamw`
    (square-root scaling)."""
    import torch

    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    return "adam"
