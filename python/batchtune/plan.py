"""The plan: how to train — micro-batch, accumulation, learning rate, warm-up,
precision, loader settings — under the field names of the plan JSON
(`batchtune plan --json`, the `plan` of `batchtune tune --json`)."""
from __future__ import annotations

import dataclasses
import json
import os
import stat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _checks, _core

# A plan file is a few KiB; past this it is the wrong file.
_MAX_PLAN_FILE_BYTES = 16 << 20


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
    token_budget: int = 0
    """Sequences of varying length (`tune(..., lengths=...)`): padded tokens
    per micro-batch at most (samples × the longest of them), a budget that
    fits at every length up to the longest; 0 for a plan of fixed batches."""
    length_buckets: List[Dict[str, int]] = dataclasses.field(default_factory=list)
    """With a token budget: the buckets by length, shortest first, each
    `{"max_length", "micro_batch_size"}` (the micro-batch that fits at its
    bound)."""
    tokens_per_step: int = 0
    """With a token budget: real tokens per optimizer step over every
    process (the budget on each by default), reached by accumulating
    micro-batches; the lr belongs to the samples such a step holds."""
    checkpointing: str = "off"
    """Activation checkpointing: "on" when the plan keeps it (the blocks
    recompute their activations in the backward pass; `Trainer` turns it on),
    else "off"."""
    checkpoint_modules: List[str] = dataclasses.field(default_factory=list)
    """With checkpointing on: the class names of the modules that recompute;
    empty for the model's own switch (`gradient_checkpointing_enable()`)."""
    activation_memory_budget: float = 0.0
    """With checkpointing on, for a compiled model: the compiler's selective
    checkpointing budget (`torch._functorch.config.activation_memory_budget`,
    above 0 and below 1) that stands for whole blocks recomputed; `Trainer`
    sets it. 0 where blocks recompute."""
    memory_format: str = "contiguous"
    """"channels_last" where the plan keeps a convolutional model's weights
    and images in NHWC (`tune(memory_format=...)`; `Trainer` converts the
    model and each batch's 4-D float tensors), else "contiguous"."""
    reasons: List[str] = dataclasses.field(default_factory=list)
    """One sentence per choice, saying why and where its value came from."""
    warnings: List[str] = dataclasses.field(default_factory=list)
    """What the plan could not know and guessed (the batch the lr belongs to)."""
    workload: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """What the plan was measured on (model, input, optimizer, base_lr,
    base_batch, device, memory_limit_bytes, parameters), as the plan JSON's `workload`."""

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
        """The plan JSON's fields; the token fields only with a token budget,
        the checkpointing ones only when on and the memory format only when
        channels_last, as the core writes them."""
        data = dataclasses.asdict(self)
        if self.token_budget <= 0:
            for key in ("token_budget", "length_buckets", "tokens_per_step"):
                del data[key]
        if self.checkpointing != "on":
            for key in ("checkpointing", "checkpoint_modules"):
                del data[key]
        if self.checkpointing != "on" or self.activation_memory_budget <= 0:
            del data["activation_memory_budget"]
        if self.memory_format == "contiguous":
            del data["memory_format"]
        return data

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
        """Reads a plan file (`batchtune plan --json` or `tune --json` output)
        as the CLI's `--plan` reads it: UTF-8 JSON (a byte-order mark is
        skipped), a few levels deep; anything else raises `batchtune.Error`
        naming the file."""
        if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: give the plan file's path (a str), got {path!r}")
        path = os.fspath(path)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise _core.Error(f"path: {path} is not a regular file (a folder, a device or a "
                                  "FIFO); give a plan file written by batchtune plan --json")
            with open(path, "rb") as f:
                data = f.read(_MAX_PLAN_FILE_BYTES + 1)
        except OSError as e:
            raise _core.Error(f"path: cannot read the plan {path} ({e.strerror}); give a plan file "
                              "written by batchtune plan --json") from None
        if len(data) > _MAX_PLAN_FILE_BYTES:
            raise _core.Error(f"{path}: is larger than {_MAX_PLAN_FILE_BYTES // (1 << 20)} MiB; a "
                              "plan is a few KiB: give a plan file written by batchtune plan --json")
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise _core.Error(f"{path}: is UTF-16 text; save the plan as UTF-8")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _core.Error(f"{path}: is not UTF-8 text (byte {e.start}); save the plan as "
                              "UTF-8") from None
        # The core's reader, as `--plan`: a BOM skipped, the depth bounded,
        # errors with the file's name and the position.
        checked = json.loads(_core.check_plan_json(text, path))
        return cls(**checked)

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
        given; the micro-batch rounded down to a multiple of `multiple_of`.
        A bad argument raises `TypeError` or `batchtune.Error` naming it."""
        micro_batch_size = _checks.integer("micro_batch_size", micro_batch_size)
        target_batch = _checks.optional_integer("target_batch", target_batch)
        world_size = _checks.integer("world_size", world_size)
        base_lr = _checks.number("base_lr", base_lr, "positive")
        if not (0 < base_lr <= _checks.MAX_LEARNING_RATE):
            raise _core.Error(f"base_lr: must be positive and at most {_checks.MAX_LEARNING_RATE:g}, "
                              f"got {base_lr:g}")
        base_batch = _checks.optional_integer("base_batch", base_batch)
        optimizer = _checks.choice("optimizer", optimizer, _checks.OPTIMIZERS)
        if warmup_steps is not None:
            warmup_steps = _checks.integer("warmup_steps", warmup_steps, -_checks.MAX_PLAN_COUNT)
            if warmup_steps < 0:
                raise _core.Error(f"warmup_steps: must be 0 or more steps, got {warmup_steps}")
        amp = _checks.choice("amp", amp, ("off", "bf16", "fp16"))
        workers = _checks.whole("workers", workers)
        if not 0 <= workers <= _checks.MAX_WORKERS:
            raise _core.Error(f"workers: must be 0 (load on the training thread) to "
                              f"{_checks.MAX_WORKERS}, got {workers}")
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory: must be True or False, got {pin_memory!r}")
        prefetch = _checks.whole("prefetch", prefetch)
        if not 0 <= prefetch <= _checks.MAX_PREFETCH:
            raise _core.Error(f"prefetch: must be 0 to {_checks.MAX_PREFETCH} batches per worker, "
                              f"got {prefetch}")
        multiple_of = _checks.integer("multiple_of", multiple_of, 1, _checks.MAX_PLAN_COUNT)
        tolerance = _checks.number("tolerance", tolerance, "at least 0 and below 1")
        text = _core.make_plan(
            micro_batch_size=micro_batch_size, target_batch=target_batch or 0,
            world_size=world_size, base_lr=base_lr, base_batch=base_batch or 0,
            optimizer=optimizer, lr_scaling=lr_scaling or "",
            warmup_steps=-1 if warmup_steps is None else warmup_steps, amp=amp,
            workers=workers, pin_memory=pin_memory, prefetch=prefetch,
            multiple_of=multiple_of, speeds=[(int(b), float(s)) for b, s in speeds],
            speed_tolerance=tolerance)
        return cls(**json.loads(text))

    def lr_at(self, step: int) -> float:
        """The learning rate at optimizer step `step` (from 0): linear warm-up
        to `lr`, then constant."""
        return _core.scheduled_lr(self.lr, self.warmup_steps, step)


def group_lr_ratios(lrs: Sequence[float]) -> List[float]:
    """Each parameter group's share of the plan's lr: its lr relative to the
    first group whose lr is not 0. A group at lr 0 (frozen) gets 0 and stays
    frozen; when every group is at 0 every share is 0."""
    reference = next((lr for lr in lrs if lr != 0), 0.0)
    return [lr / reference if reference else 0.0 for lr in lrs]


def reference_lr(lrs: Sequence[float]) -> float:
    """The lr the plan's lr stands for: the first group's that is not 0 (0
    when every group is frozen)."""
    return next((float(lr) for lr in lrs if lr != 0), 0.0)


def optimizer_kind(optimizer) -> str:
    """`sgd` for SGD-like optimizers (linear lr scaling), else `adam`/`adamw`
    (square-root scaling)."""
    import torch

    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    return "adam"
