"""batchtune for the Hugging Face `Trainer`: `tune_training_args`.

Where `TrainingArguments(auto_find_batch_size=True)` restarts the training
loop at × 0.9 of the batch after each out-of-memory — changing the effective
batch, leaving accumulation and the learning rate as they were —, this tunes
the model's real training step first (the loss of the model's output on
collated batches of your data set, the heaviest samples first, with the
optimizer the Trainer will make) and returns `TrainingArguments` that keep
the global batch: `per_device_train_batch_size` × `gradient_accumulation_steps`
× processes = the target, `learning_rate` and `warmup_steps` as the plan
scales them, `bf16`/`fp16` from the plan. Nothing is left changed on the model.

Example::

    from transformers import Trainer, TrainingArguments
    from batchtune.huggingface import tune_training_args

    args = TrainingArguments("out", per_device_train_batch_size=64, use_cpu=True)
    args = tune_training_args(model, args, train_dataset, memory_limit="256MiB")
    Trainer(model=model, args=args, train_dataset=train_dataset).train()

Under `accelerate launch` / `torchrun` with several processes: call it on
every process (it is collective), after the `TrainingArguments` are made
(they initialise the process group); every process tunes its own device, the
smallest choice wins, every process returns the same arguments, with the
global batch counted over all processes. Without a launcher on a machine of
several GPUs (the Trainer's `DataParallel`, `n_gpu` > 1) the micro-batch is
tuned on the first GPU and the global batch counts every GPU.

Sequences of varying length: `lengths="auto"` (or the samples' lengths)
tunes by them (`batchtune.tune(..., lengths=...)`, on random token ids of
the model's vocabulary) and plans a token budget; `TokenBudgetTrainer`
trains by it, each micro-batch at most the budget's padded tokens::

    args, result = tune_training_args(model, args, train_dataset, lengths="auto",
                                      memory_limit="256MiB", return_result=True)
    TokenBudgetTrainer(model=model, args=args, train_dataset=train_dataset,
                       plan=result.plan).train()

Needs transformers (`pip install transformers`); `import batchtune` does not.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import numbers
import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from . import _core
from ._configuration import apply_configuration
from ._fit import missing
# dataset_lengths is public here: what lengths="auto" reads.
from ._lengths import (dataset_lengths, parse_lengths, resolve_lengths,  # noqa: F401
                       sample_length, sequence_length)
from ._samples import HeaviestFirst
from ._sharded import is_sharded
from ._results import TuneResult
from ._tune import tune
from .plan import Plan

try:
    import transformers
except ImportError as _error:  # transformers is optional
    raise missing("batchtune.huggingface", "transformers", "transformers", _error) from None

# Batch keys the Trainer keeps although forward() does not name them.
_LABEL_KEYS = ("labels", "label", "label_ids")


def _model_inputs(model: torch.nn.Module) -> Optional[set]:
    """The keyword arguments forward() takes, or None when it takes **kwargs."""
    params = inspect.signature(model.forward).parameters
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return set(params) | set(_LABEL_KEYS)


def _output_loss(output: Any) -> torch.Tensor:
    loss = None
    if isinstance(output, dict) or hasattr(output, "keys"):
        loss = output.get("loss") if hasattr(output, "get") else None
    elif isinstance(output, (list, tuple)) and output:
        loss = output[0]
    if not isinstance(loss, torch.Tensor):
        raise _core.Error("train_dataset: the model's output has no loss on a collated batch; give "
                          "the samples `labels` (or pass a Trainer whose compute_loss makes one)")
    return loss


@contextlib.contextmanager
def _training_mode(model: torch.nn.Module, device: torch.device):
    """The model in train mode on the Trainer's device for the trials, and
    back as it was (mode and device) afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    first = next(model.parameters(), None)
    original = first.device if first is not None else device
    if original != device:
        model.to(device)
    model.train()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        if original != device:
            model.to(original)


def _optimizer(trainer, model: torch.nn.Module, args) -> torch.optim.Optimizer:
    """The optimizer the Trainer will make (`args.optim`, its kwargs), or the
    Trainer's own when it was given one; its state is what is measured."""
    if trainer is not None and trainer.optimizer is not None:
        return trainer.optimizer
    cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise _core.Error("model: has no parameter that requires grad; there is nothing to train")
    return cls(params, **kwargs)


def replicas(args: "transformers.TrainingArguments") -> int:
    """How many devices each take `per_device_train_batch_size` of a step:
    the processes (`world_size`) times the GPUs each process drives. Without
    a launcher on a machine of several GPUs the Trainer wraps the model in
    `DataParallel` over `n_gpu` GPUs in one process (`world_size` 1) and
    loads `per_device_train_batch_size × n_gpu` per step; under a launcher
    `n_gpu` is 1; on the CPU it is 0."""
    return int(args.world_size) * max(1, int(getattr(args, "n_gpu", 1) or 0))


# -- sequences of varying length ---------------------------------------------

def _shards_later(args: "transformers.TrainingArguments", model: torch.nn.Module) -> bool:
    """Whether the Trainer will shard a model that is not sharded yet: FSDP
    asked in the arguments (`fsdp`) or by `accelerate launch --use_fsdp`."""
    asked = bool(getattr(args, "fsdp", None)) or \
        os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    return asked and not is_sharded(model)


def _vocab_size(model: torch.nn.Module) -> int:
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(size, numbers.Integral) and hasattr(model, "get_input_embeddings"):
        embeddings = model.get_input_embeddings()
        size = getattr(embeddings, "num_embeddings", None)
    if not isinstance(size, numbers.Integral) or size < 1:
        raise _core.Error(f"model: lengths= tunes on random token ids of the model's vocabulary, and "
                          f"{type(model).__name__} has no config.vocab_size or input embeddings; tune "
                          "without lengths (on padded batches of your data set)")
    return int(size)


def _check_positions(model: torch.nn.Module, longest: int) -> None:
    """A sample longer than the model's positions would fail inside the
    first trial: said here, with the fix."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, numbers.Integral) and 0 < positions < longest:
        raise _core.Error(f"lengths: the longest sample has {longest} tokens, more than the model's "
                          f"max_position_embeddings ({positions}); cut the samples to {positions} "
                          "tokens (tokenizer(..., truncation=True, max_length=...))")


class RandomTokens:
    """`make_batch(n, length)` for `tune(..., lengths=...)`: n sequences of
    `length` random token ids of the model's vocabulary, shaped as the data
    set's samples are: `labels` the ids (added when the samples have none,
    as a language-model collator adds them), `attention_mask` ones, any
    other per-token field zeros, a per-sample field (a class label)
    repeated. Its own generator: the training's random state is not
    touched."""

    def __init__(self, vocab: int, sample: Any, convert: Callable[[Any], Any]):
        length = sample_length(sample)
        if length is None:
            raise _core.Error("train_dataset: lengths= tunes on token ids, and its samples have no "
                              "`input_ids`; tokenize them first, or tune without lengths")
        self.vocab = vocab
        self.convert = convert
        self.per_token: List[str] = []
        self.per_sample: Dict[str, torch.Tensor] = {}
        for key in sample.keys():
            value = sample[key]
            if key == "input_ids":
                continue
            if sequence_length(value) == length:
                self.per_token.append(key)
            elif isinstance(value, numbers.Number) or (isinstance(value, torch.Tensor) and value.dim() == 0):
                self.per_sample[key] = torch.as_tensor(value)
            else:
                raise _core.Error(f"train_dataset: lengths= tunes on token ids, and the samples' "
                                  f"'{key}' is neither one value a token nor one a sample; tune "
                                  "without lengths (on padded batches of your data set)")
        if "labels" not in self.per_token and "labels" not in self.per_sample:
            self.per_token.append("labels")

    def __call__(self, n: int, length: int) -> Any:
        generator = torch.Generator().manual_seed(n * 100003 + length)
        ids = torch.randint(0, self.vocab, (n, length), generator=generator)
        batch: Dict[str, torch.Tensor] = {"input_ids": ids}
        for key in self.per_token:
            batch[key] = ids.clone() if key == "labels" else \
                torch.ones_like(ids) if key == "attention_mask" else torch.zeros_like(ids)
        for key, value in self.per_sample.items():
            batch[key] = value.expand(n).clone()
        return self.convert(batch)


def _first_sample(dataset: Any) -> Any:
    with _core.uncounted():
        if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") and \
                not isinstance(dataset, torch.utils.data.IterableDataset):
            if len(dataset) == 0:
                raise _core.Error("train_dataset: is empty; batchtune tunes on its samples")
            return dataset[0]
        for sample in dataset:
            return sample
    raise _core.Error("train_dataset: yields no samples; batchtune tunes on its samples")


class _RaggedCheck:
    """The collator of the trials' batches, saying so in one line when it
    cannot stack samples of different lengths (the default collator on
    ragged token data), with the fix."""

    def __init__(self, collator: Callable, data: Callable[[], Tuple[Any, Any]]):
        self.collator = collator
        self.data = data  # the heaviest and the lightest sample, for the range

    def __call__(self, samples: List[Any]) -> Any:
        try:
            return self.collator(samples)
        except (ValueError, RuntimeError, TypeError) as e:
            if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e):
                raise  # a trial's out-of-memory: the runner's to count
            lengths = {sample_length(s) for s in list(samples) + list(self.data())} - {None}
            if len(lengths) < 2:
                raise
            inner = getattr(self.collator, "data_collator", self.collator)
            name = getattr(inner, "__name__", type(inner).__name__)
            cause = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise _core.Error(
                f"data_collator: the samples have different lengths ({min(lengths)} to "
                f"{max(lengths)} tokens) and {name} cannot stack them ({type(e).__name__}: {cause}); "
                "pass data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False) or "
                "batchtune.pad_collate, and lengths=\"auto\" to tune by their lengths") from None


# -- the helper --------------------------------------------------------------

def tune_training_args(trainer_or_model: Union["transformers.Trainer", torch.nn.Module],
                       args: Optional["transformers.TrainingArguments"] = None,
                       train_dataset: Any = None, *,
                       data_collator: Optional[Callable] = None,
                       target_batch: Optional[int] = None, objective: str = "throughput",
                       amp: str = "auto", memory_limit=None, margin: float = _core.DEFAULT_MARGIN,
                       time_budget: float = _core.DEFAULT_TIME_BUDGET, report: Optional[str] = None,
                       return_result: bool = False, quiet: bool = False, lengths: Any = None,
                       **tune_kwargs: Any) -> Union["transformers.TrainingArguments",
                                                    Tuple["transformers.TrainingArguments", TuneResult]]:
    """Tunes the Trainer's training step and returns the `TrainingArguments`
    to train with (a copy; `args` is not changed).

    Args:
        trainer_or_model: a `transformers.Trainer` (its model, args, train
            data set, collator, `compute_loss` and, if it has one, optimizer),
            or the model, with `args` and `train_dataset`.
        args: the TrainingArguments (default: the Trainer's).
        train_dataset: map-style or iterable samples (default: the Trainer's);
            batches are `data_collator` (default: the Trainer's, else
            `transformers.default_data_collator`) of its heaviest samples.
            Samples of different lengths need a collator that pads them
            (else `batchtune.Error` naming `data_collator`).
        target_batch: the global batch over all processes; default the one
            `args` configure (per-device × accumulation × processes), kept.
            With `lengths`: samples a step at the data's mean length; default
            one token budget a process.
        objective, amp, memory_limit, margin, time_budget, report: as
            `batchtune.tune` (`memory_limit`: the CPU's emulated device).
        return_result: also return the `TuneResult` (with the plan).
        quiet: no summary on stderr.
        lengths: sequences of varying length: "auto" (every sample's
            `input_ids` length, read from `train_dataset`), the samples'
            lengths (a list of ints) or a `(shortest, longest)` tuple. The
            trials then run on random token ids of the model's vocabulary
            at each length the tune asks (`batchtune.tune(..., lengths=...)`),
            and the plan (`return_result=True`: `result.plan`) has a
            `token_budget`: train with `TokenBudgetTrainer(plan=result.plan)`.
            The returned arguments also suit a plain Trainer at fixed
            micro-batches (the plan's, padded to at most the longest).
        tune_kwargs: more `batchtune.tune` options (`max_batch`, `sweep`,
            `lr_scaling`, `warmup_steps`, `checkpointing` — "auto" measures
            the model with and without gradient checkpointing, and the
            returned arguments set `gradient_checkpointing` where the plan
            keeps it —, `memory_format` for a vision model — the model is
            left in the format the plan keeps, channels_last weights
            taking the images with them —, ...).

    Under several processes (torchrun, `accelerate launch`) every process
    calls it and gets the same arguments. A model sharded with FSDP2
    (`fully_shard`) is tuned sharded, its trials in lockstep over the
    processes; a model the Trainer is yet to shard (`fsdp` in `args`,
    `accelerate launch --use_fsdp`) is tuned whole, with a warning.

    The learning rate in `args` is taken as right for the batch `args`
    configure; it is scaled to the target (unchanged when the target is that
    batch). A plan in bf16/fp16 sets `bf16`/`fp16` (and clears the other).

    Example::

        args = tune_training_args(trainer, target_batch=256)
        trainer = Trainer(model=model, args=args, train_dataset=data)
    """
    trainer = trainer_or_model if isinstance(trainer_or_model, transformers.Trainer) else None
    if trainer is not None:
        model = trainer.model
        args = args if args is not None else trainer.args
        train_dataset = train_dataset if train_dataset is not None else trainer.train_dataset
        data_collator = data_collator if data_collator is not None else trainer.data_collator
    else:
        model = trainer_or_model
        if not isinstance(model, torch.nn.Module):
            raise _core.Error(f"trainer_or_model: give a transformers.Trainer or the model "
                              f"(an nn.Module), got {type(model).__name__}")
        if args is None:
            raise _core.Error("args: give the TrainingArguments to tune (or pass a Trainer)")
        data_collator = data_collator or transformers.default_data_collator
    if train_dataset is None:
        raise _core.Error("train_dataset: give the training data set (or a Trainer that has one); "
                          "batchtune tunes on its samples")
    if target_batch is not None and target_batch < 1:
        raise _core.Error(f"target_batch: must be at least 1, got {target_batch}")
    for reserved in ("device", "group", "target_batch", "base_lr", "base_batch", "world_size"):
        if reserved in tune_kwargs:
            raise _core.Error(f"{reserved}: tune_training_args takes it from the TrainingArguments; "
                              "leave it out")
    lengths = resolve_lengths(lengths, train_dataset) if lengths is not None else None
    if lengths is not None:
        _check_positions(model, parse_lengths(lengths).longest)
    device = torch.device(args.device)  # under a launcher this initialises the process group
    world = replicas(args)
    configured = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    # By lengths the step is counted in tokens: one budget a process unless asked.
    target = target_batch if lengths is not None else (target_batch or configured)

    make_batch, kwargs = _trial_batches(trainer, model, args, train_dataset, data_collator, lengths,
                                        world, dict(tune_kwargs))
    if trainer is not None:
        def loss_fn(m, batch):
            # A copy: compute_loss may pop the labels, and a trial steps its batch more than once.
            return trainer.compute_loss(m, dict(batch))
    else:
        def loss_fn(m, batch):
            return _output_loss(m(**batch))

    if lengths is not None:
        kwargs["lengths"] = lengths
    if _shards_later(args, model):
        warnings.warn("batchtune: the Trainer will shard this model with FSDP, but it is tuned whole "
                      "on every process: the plan is smaller than sharding allows; to tune what you "
                      "train, shard it with torch's fully_shard (FSDP2) before tune_training_args, "
                      "which accelerate then keeps as it is", stacklevel=2)
    # The base lr is the TrainingArguments', not a base_lr the caller gave.
    sources = {"base_lr": "the TrainingArguments' learning_rate"}
    # The tune plans for the whole job: the target batch over `world`
    # processes (under a launcher its agreement over the process group
    # gives every process the same plan).
    with _training_mode(model, device):
        optimizer = _optimizer(trainer, model, args)
        result = tune(model, optimizer, loss_fn, make_batch, device=device, amp=amp,
                      objective=objective, memory_limit=memory_limit, margin=margin,
                      time_budget=time_budget,
                      report=report if args.process_index == 0 else None,
                      target_batch=target, world_size=world, base_lr=args.learning_rate,
                      base_batch=configured, _sources=sources, **kwargs)
        del optimizer
    if not result.complete:
        raise KeyboardInterrupt
    if result.chosen_batch_size < 1 or result.plan is None:
        reason = result.diagnosis or (result.trials[0].error if result.trials else "")
        raise _core.Error(f"memory_limit: not even batch 1 of {type(model).__name__} fits ({reason}); "
                          "give more memory or a smaller model")
    # The model as the plan trains it (the memory format; the compiler's
    # checkpointing budget, which the tune put back).
    apply_configuration(model, result.plan)
    tuned = _tuned_args(args, result.plan)
    if not quiet and args.process_index == 0:
        _say(tuned, result.plan, world)
    return (tuned, result) if return_result else tuned


def _trial_batches(trainer, model: torch.nn.Module, args, train_dataset: Any,
                   data_collator: Callable, lengths: Any, world: int,
                   kwargs: Dict[str, Any]) -> Tuple[Callable, Dict[str, Any]]:
    """The trials' `make_batch` and the tune options it bounds: by lengths,
    random token ids of the model's vocabulary shaped as the samples; else
    the heaviest samples collated as the Trainer's loader collates them,
    the batch at most this process's share of the data."""
    if trainer is not None and args.remove_unused_columns:
        # As the Trainer's own loader does.
        remove = getattr(trainer, "_remove_unused_columns", None)
        try:
            import datasets  # noqa: F401

            is_hf_dataset = isinstance(train_dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset and remove is not None:
            train_dataset = remove(train_dataset, description="training")
        elif hasattr(trainer, "_get_collator_with_removed_columns"):
            data_collator = trainer._get_collator_with_removed_columns(data_collator, "training")
    keep = _model_inputs(model) if args.remove_unused_columns else None

    def convert(batch):
        batch = dict(batch)  # a BatchEncoding is a UserDict
        return {k: v for k, v in batch.items() if keep is None or k in keep}

    if lengths is not None:
        return RandomTokens(_vocab_size(model), _first_sample(train_dataset), convert), kwargs
    heaviest: Dict[str, Any] = {}

    def extremes():
        if not heaviest:  # the data set's longest and shortest, for the message
            with _core.uncounted():
                heaviest["pair"] = (make_batch._sample(make_batch.order[0]),
                                    make_batch._sample(make_batch.order[-1]))
        return heaviest["pair"]

    make_batch = HeaviestFirst(train_dataset, _RaggedCheck(data_collator, extremes),
                               convert=convert, what="train_dataset")
    if make_batch.size is not None:
        kwargs["max_batch"] = min(kwargs.get("max_batch", _core.DEFAULT_MAX_BATCH),
                                  max(1, make_batch.size // world))
    return make_batch, kwargs


def _tuned_args(args, plan: Plan):
    """A copy of `args` with the plan: micro-batch, accumulation, lr, its
    warm-up (unless `args` already warm up longer), precision, eval batch,
    gradient checkpointing where the plan keeps it."""
    changes = dict(per_device_train_batch_size=plan.micro_batch_size,
                   gradient_accumulation_steps=plan.accumulation_steps,
                   learning_rate=plan.lr, bf16=plan.amp == "bf16", fp16=plan.amp == "fp16")
    if plan.eval_micro_batch_size > 0:
        changes["per_device_eval_batch_size"] = plan.eval_micro_batch_size
    if plan.checkpointing == "on" and not plan.checkpoint_modules and \
            plan.activation_memory_budget <= 0:  # the model's own switch
        # transformers 5.2x names it activation_checkpointing (the old name
        # an alias that a copy of the args overwrites).
        name = "activation_checkpointing" if hasattr(args, "activation_checkpointing") else \
            "gradient_checkpointing"
        changes[name] = True
        changes[f"{name}_kwargs"] = {"use_reentrant": False}
    if plan.warmup_steps > 0 and not (args.warmup_steps >= 1 and args.warmup_steps >= plan.warmup_steps):
        changes["warmup_steps"] = plan.warmup_steps
    return dataclasses.replace(args, **changes)


def _say(tuned, plan: Plan, world: int) -> None:
    print(f"batchtune: per_device_train_batch_size {plan.micro_batch_size} x "
          f"gradient_accumulation_steps {plan.accumulation_steps} x {world} device(s) = "
          f"global batch {plan.global_batch_size}; learning_rate {plan.lr:.6g}, "
          f"warmup_steps {tuned.warmup_steps}, {'bf16' if tuned.bf16 else 'fp16' if tuned.fp16 else 'fp32'}",
          file=sys.stderr)
    if plan.token_budget > 0:
        print(f"batchtune: token budget {plan.token_budget} padded tokens a micro-batch, "
              f"{plan.tokens_per_step} tokens a step: train with "
              "batchtune.huggingface.TokenBudgetTrainer(plan=result.plan)", file=sys.stderr)
    for reason in plan.reasons:
        print(f"batchtune:   {reason}", file=sys.stderr)


# Training by the token budget: the Trainer whose loader is a TokenBudgetSampler.
from ._huggingface_tokens import LanguageModelPad, TokenBudgetTrainer  # noqa: E402,F401
