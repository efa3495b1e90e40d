#!/usr/bin/env python3
"""A Hugging Face causal LM on text of varying length, one epoch from Python:
the token-budget plan of `batchtune.tune(..., lengths=...)` against the
largest fixed batch that fits at the longest length (each batch padded to its
own longest sample) and against Hugging Face's `group_by_length`
(`LengthGroupedSampler`, the same fixed batch).

    python bench/lm_lengths.py [--rounds 3] [--samples 604] [--memory-limit 512MiB] [--json FILE]

The model is `GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4,
vocab_size=5000))`, AdamW; the data are `--samples` sequences of 16 to 512
random tokens, their lengths drawn log-normal (median 50, mean about 70),
as chat and web text are. The two plans are tuned once, each way trains
from the same starting weights under `batchtune.emulated_memory` of the
same limit, every way a `batchtune.Trainer` (token budget: one budget of
micro-batches a step, its loss weighted by real tokens; fixed: one batch a
step). The ways take turns (`--rounds` epochs each, the order rotated each
round) and the table gives medians; the padding and out-of-memory counts are
exact. Tokens/s counts real (label) tokens; padding is computed, not counted.
"""
import argparse
import copy
import json
import math
import random
import statistics
import sys
import time

import torch

import batchtune


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=604)
    p.add_argument("--memory-limit", default="512MiB")
    p.add_argument("--time-budget", type=float, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    return p.parse_args()


def lm_loss(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 labels=batch["labels"]).loss


def label_tokens(batch):
    """The items a causal LM's loss averages over: the labels after the shift."""
    return (batch["labels"][:, 1:] != -100).sum()


def corpus(n, seed, vocab):
    rng = random.Random(seed)
    lengths = [min(512, max(16, int(rng.lognormvariate(math.log(50), 0.8)))) for _ in range(n)]
    lengths[0] = 512  # the longest the plans must fit
    g = torch.Generator().manual_seed(seed)
    samples = []
    for length in lengths:
        ids = torch.randint(0, vocab, (length,), generator=g)
        samples.append({"input_ids": ids, "labels": ids.clone(),
                        "attention_mask": torch.ones(length, dtype=torch.long)})
    return lengths, samples


def make_batch_for(vocab):
    def make_batch(n, length=512):
        ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(n))
        return {"input_ids": ids, "labels": ids.clone(),
                "attention_mask": torch.ones(n, length, dtype=torch.long)}
    return make_batch


def epoch(way, model0, plan, lengths, samples, limit, seed):
    """One epoch of `way`; (seconds, real tokens, padded tokens, steps, ooms)."""
    collate = batchtune.pad_collate
    if way == "token budget":
        sampler = batchtune.TokenBudgetSampler(lengths, plan, seed=seed)
        loader = torch.utils.data.DataLoader(samples, batch_sampler=sampler, collate_fn=collate)
        steps = sampler.group(loader)
    else:
        if way == "fixed":
            batch_sampler = torch.utils.data.BatchSampler(
                torch.utils.data.RandomSampler(samples, generator=torch.Generator().manual_seed(seed)),
                plan.micro_batch_size, drop_last=False)
        else:  # Hugging Face's group_by_length
            from transformers.trainer_pt_utils import LengthGroupedSampler
            torch.manual_seed(seed)
            batch_sampler = torch.utils.data.BatchSampler(
                LengthGroupedSampler(plan.micro_batch_size, lengths=lengths),
                plan.micro_batch_size, drop_last=False)
        loader = torch.utils.data.DataLoader(samples, batch_sampler=batch_sampler,
                                             collate_fn=collate)
        steps = ([b] for b in loader)
    real = padded = count = 0
    with batchtune.emulated_memory(limit):
        # Made inside the budget: the weights count, as on a GPU.
        model = copy.deepcopy(model0).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=plan.lr)
        trainer = batchtune.Trainer(model, optimizer, lm_loss, plan, loss_items=label_tokens,
                                    scale_lr=False)
        start = time.perf_counter()
        for micro_batches in steps:
            trainer.step(micro_batches=micro_batches)
            count += 1
            for b in micro_batches:
                real += int(b["attention_mask"].sum())
                padded += b["input_ids"].numel()
        seconds = time.perf_counter() - start
    return seconds, real, padded, count, len(trainer.recoveries)


def main():
    a = parse()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(a.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=5000, n_positions=512)
    model0 = GPT2LMHeadModel(config)
    lengths, samples = corpus(a.samples, a.seed, config.vocab_size)
    make_batch = make_batch_for(config.vocab_size)

    def tuned(**kw):
        model = copy.deepcopy(model0)
        opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
        return batchtune.tune(model, opt, lm_loss, make_batch, memory_limit=a.memory_limit,
                              amp="off", time_budget=a.time_budget, base_batch=8, **kw)

    t0 = time.perf_counter()
    by_tokens = tuned(lengths=lengths)
    t1 = time.perf_counter()
    fixed = tuned(sweep=False)  # the largest batch at 512 tokens
    t2 = time.perf_counter()
    plans = {"token budget": by_tokens.plan, "fixed": fixed.plan, "group_by_length": fixed.plan}
    print(f"token budget {by_tokens.plan.token_budget} tokens, buckets "
          f"{[(b['max_length'], b['micro_batch_size']) for b in by_tokens.plan.length_buckets]}, "
          f"{by_tokens.plan.tokens_per_step} tokens a step (tune {t1 - t0:.0f} s); "
          f"largest fixed batch at 512: {fixed.max_batch_size} (search {t2 - t1:.0f} s)",
          file=sys.stderr)
    ways = list(plans)
    runs = {w: [] for w in ways}
    for r in range(a.rounds):
        for w in ways[r % len(ways):] + ways[:r % len(ways)]:
            runs[w].append(epoch(w, model0, plans[w], lengths, samples, a.memory_limit, a.seed + r))
            s, real, padded, steps, ooms = runs[w][-1]
            print(f"round {r} {w}: {s:.1f} s, {real / s:.0f} tokens/s, {steps} steps, {ooms} OOM",
                  file=sys.stderr)
    rows = []
    for w in ways:
        tps = [real / s for s, real, _, _, _ in runs[w]]
        s, real, padded, steps, _ = runs[w][0]
        rows.append({"way": w, "micro_batch": (f"{plans[w].token_budget} tokens" if w == "token budget"
                                               else f"{plans[w].micro_batch_size} samples"),
                     "steps": steps, "padding": 1 - real / padded,
                     "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps),
                     "tokens_per_s_max": max(tps),
                     "seconds": statistics.median(s for s, *_ in runs[w]),
                     "out_of_memory": sum(o for *_, o in runs[w])})
    base = {r["way"]: r["tokens_per_s"] for r in rows}
    print("| batching | micro-batch | optimizer steps | padding | tokens/s (median, min-max) | "
          "vs token budget | out-of-memory | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['way']} | {r['micro_batch']} | {r['steps']} | {100 * r['padding']:.1f} % | "
              f"{r['tokens_per_s']:.0f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}) | "
              f"{base['token budget'] / r['tokens_per_s']:.2f}x | {r['out_of_memory']} | "
              f"{r['seconds']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "token_budget": by_tokens.plan.to_dict(),
                       "fixed_max_batch": fixed.max_batch_size, "rounds": a.rounds}, f, indent=1)


if __name__ == "__main__":
    main()
