"""`batchtune.huggingface.TokenBudgetTrainer`: the Hugging Face `Trainer`
whose train loader's batch sampler is a `TokenBudgetSampler`, each optimizer
step weighted by its label tokens (the Trainer's `num_items_in_batch`), and
`LanguageModelPad`, its collator when given none."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from typing import Any, Dict, List

import torch
import transformers

from . import _core
from ._lengths import dataset_lengths, resolve_lengths, sample_length
from .plan import Plan
from .token_sampler import PadCollate, TokenBudgetSampler


class LanguageModelPad:
    """`TokenBudgetTrainer`'s collator when given none: `PadCollate` (the
    pad token for the ids, -100 for `labels`), and where the samples have
    no `labels`, their input ids as labels with the padding -100 — what
    `DataCollatorForLanguageModeling(tokenizer, mlm=False)` makes."""

    def __init__(self, pad_value: int = 0):
        self.pad = PadCollate(pad_value=pad_value)

    def __call__(self, samples: List[Any]) -> Any:
        batch = self.pad(samples)
        if isinstance(batch, dict) and "input_ids" in batch and "labels" not in batch:
            ids = batch["input_ids"]
            lengths = torch.tensor([sample_length(s) or 0 for s in samples])
            real = torch.arange(ids.shape[-1]) < lengths[:, None]
            batch["labels"] = ids.masked_fill(~real, -100)
        return batch


_TRAINER_SIGNATURE = inspect.signature(transformers.Trainer.__init__)


class TokenBudgetTrainer(transformers.Trainer):
    """A `transformers.Trainer` that trains by a plan's token budget: its
    train loader's batch sampler is a `batchtune.TokenBudgetSampler` (every
    micro-batch at most `plan.token_budget` padded tokens, the short samples
    many to one, every sample once an epoch, reshuffled by the epoch, seeded
    by `args.data_seed` or `args.seed`); under DDP (`torchrun`/`accelerate
    launch`) each process takes its own share (the sampler shards by rank,
    every rank the same count, and accelerate's own sharding is turned off
    for it, as the Trainer does for its `BatchRebalanceSampler`).

    Args:
        plan: the tune's plan with a token budget (`tune_training_args(...,
            lengths=..., return_result=True)` → `result.plan`, or
            `batchtune.tune(..., lengths=...)`).
        lengths: every sample's tokens, in the data set's order; default
            read from `train_dataset` (its `input_ids`).
        everything else: as `transformers.Trainer`. Without a
            `data_collator` the micro-batches are padded by `LanguageModelPad`
            (the tokenizer's pad token, labels -100; samples without labels
            get their input ids, as `DataCollatorForLanguageModeling(mlm=False)`
            gives them).

    The loss weighting — why it is right: a causal LM's loss is a mean over
    tokens, and the micro-batches of a step hold different numbers of them.
    The step accumulates `gradient_accumulation_steps` micro-batches, set
    here to the sampler's mean micro-batches per optimizer step (its
    `steps()`, the plan's `tokens_per_step`), replacing the one in `args`.
    The Trainer counts the label tokens of the step's micro-batches
    (`get_batch_samples` → `num_items_in_batch`, all processes' when
    `average_tokens_across_devices`, the default) and the model divides its
    summed loss by that count, so every token weighs the same whatever
    micro-batch it came in: the accumulated gradient is the per-token mean
    of the whole step. (Averaging each micro-batch's mean, what the Trainer
    does without `num_items_in_batch`, would weigh a token of a short
    micro-batch more.) Hence it refuses a model whose forward takes no
    `**kwargs` (and no `compute_loss_func`) when a step has several
    micro-batches or processes, and `average_tokens_across_devices=False`
    under DDP. `per_device_train_batch_size` does not apply to training.

    Example::

        trainer = TokenBudgetTrainer(model=model, args=args, train_dataset=data,
                                     plan=result.plan)
        trainer.train()
        trainer.token_sampler.padding()   # real and padded tokens of an epoch
    """

    def __init__(self, *trainer_args: Any, plan: Plan, lengths: Any = None, **trainer_kwargs: Any):
        bound = _TRAINER_SIGNATURE.bind_partial(self, *trainer_args, **trainer_kwargs)
        given = bound.arguments
        args, dataset = given.get("args"), given.get("train_dataset")
        if args is None:
            raise _core.Error("args: give the TrainingArguments (tune_training_args(..., lengths=...) "
                              "returns them)")
        if dataset is None:
            raise _core.Error("train_dataset: TokenBudgetTrainer samples the training data set by its "
                              "lengths; give train_dataset")
        if args.auto_find_batch_size:
            raise _core.Error("auto_find_batch_size: the micro-batches are the plan's token budget, "
                              "which fits at every length; leave it False")
        if int(getattr(args, "n_gpu", 1) or 0) > 1:
            raise _core.Error(f"args: DataParallel over {args.n_gpu} GPUs in one process splits each "
                              "micro-batch of the token budget; launch one process a GPU (torchrun or "
                              "accelerate launch)")
        lengths = dataset_lengths(dataset) if lengths is None else resolve_lengths(lengths, dataset)
        if hasattr(lengths, "__len__") and hasattr(dataset, "__len__") and len(lengths) != len(dataset):
            raise _core.Error(f"lengths: {len(lengths)} lengths for a train_dataset of {len(dataset)} "
                              "samples; give one a sample, in its order")
        seed = args.data_seed if args.data_seed is not None else args.seed
        self.token_sampler = TokenBudgetSampler(lengths, plan, seed=seed,
                                                drop_last=args.dataloader_drop_last,
                                                num_replicas=args.world_size, rank=args.process_index)
        self.plan = plan
        steps = self.token_sampler.steps()
        accumulation = max(1, round(len(self.token_sampler) / len(steps)))
        given["args"] = dataclasses.replace(args, gradient_accumulation_steps=accumulation)
        if given.get("data_collator") is None:
            processing = given.get("processing_class")
            pad = getattr(processing, "pad_token_id", None)
            given["data_collator"] = LanguageModelPad(pad if isinstance(pad, int) else 0)
        super().__init__(*bound.args[1:], **bound.kwargs)
        self._check_weighting(accumulation)
        if self.args.process_index == 0:
            print(f"batchtune: TokenBudgetTrainer: micro-batches of at most {plan.token_budget} padded "
                  f"tokens, {len(self.token_sampler)} an epoch on each of {self.args.world_size} "
                  f"process(es); gradient_accumulation_steps {accumulation} (the sampler's mean per "
                  f"step of {self.token_sampler.tokens_per_step} tokens), the loss weighted by tokens "
                  "(num_items_in_batch)", file=sys.stderr)

    def _check_weighting(self, accumulation: int) -> None:
        world = self.args.world_size
        counted = self.model_accepts_loss_kwargs or self.compute_loss_func is not None or \
            self.loss_is_scaled_for_ga is not None
        if not counted and (accumulation > 1 or world > 1):
            raise _core.Error(
                f"model: {type(self.model).__name__}.forward takes no **kwargs, so the Trainer cannot "
                f"pass it num_items_in_batch and would average the means of {accumulation} "
                f"micro-batch(es) x {world} process(es) of different token counts alike; pass "
                "compute_loss_func=fn(outputs, labels, num_items_in_batch) returning the loss summed "
                "over the tokens / num_items_in_batch")
        if world > 1 and not self.args.average_tokens_across_devices:
            raise _core.Error("average_tokens_across_devices: False averages the processes' per-token "
                              "means alike though their micro-batches hold different token counts; "
                              "leave it True (the default)")

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """The train loader over `token_sampler`, with the Trainer's
        collator, workers and seeding; prepared by accelerate, whose own
        sharding is turned off (the sampler already shards by rank)."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        from transformers.trainer_utils import seed_worker

        dataset, collator = self.train_dataset, self.data_collator
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset:
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        args = self.args
        params: Dict[str, Any] = dict(
            batch_sampler=self.token_sampler, collate_fn=collator,
            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers,
            multiprocessing_context=getattr(args, "dataloader_multiprocessing_context", None),
            prefetch_factor=args.dataloader_prefetch_factor,
            worker_init_fn=functools.partial(seed_worker, num_workers=args.dataloader_num_workers,
                                             rank=args.process_index))
        if hasattr(args, "dataloader_in_order"):
            params["in_order"] = args.dataloader_in_order
        loader = self.accelerator.prepare(torch.utils.data.DataLoader(dataset, **params))
        shard = getattr(loader, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is self.token_sampler:
            shard.num_processes = 1
            shard.process_index = 0
        return loader
