"""The README's "Text of varying length" example: a causal language model on
sequences of 8 to 256 tokens, tuned by their lengths and trained one epoch by
the token budget, each micro-batch's loss weighted by its real tokens. Runs
on a CPU as written (an emulated 64 MiB device); on a GPU leave out
memory_limit.

    python examples/python/text_lengths.py
"""
import math
import random

import torch
from torch.utils.data import DataLoader

import batchtune


class TinyLM(torch.nn.Module):
    """A causal LM of any length up to 256: embedding, one causal transformer
    layer, head (your Hugging Face model works the same way)."""

    def __init__(self, vocab=1000, dim=64, longest=256):
        super().__init__()
        self.embed, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(longest, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        n = ids.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n)
        return self.head(self.layer(self.embed(ids) + self.pos(torch.arange(n)), src_mask=mask,
                                    is_causal=True))


rng = random.Random(0)
lengths = [min(256, max(8, int(rng.lognormvariate(math.log(40), 0.8)))) for _ in range(400)]
dataset = [{"input_ids": torch.randint(0, 1000, (n,))} for n in lengths]
for sample in dataset:
    sample["labels"] = sample["input_ids"]

model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

def make_batch(n, length):    # n samples of `length` tokens
    ids = torch.randint(0, 1000, (n, length))
    return {"input_ids": ids, "labels": ids}

def loss_fn(model, batch):    # the per-token mean a causal LM returns
    logits = model(batch["input_ids"])[:, :-1]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                             ignore_index=-100)

result = batchtune.tune(model, optimizer, loss_fn, make_batch, lengths=lengths,
                        memory_limit="64MiB", time_budget=60)
sampler = batchtune.TokenBudgetSampler(lengths, result.plan)
loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=batchtune.pad_collate)
trainer = batchtune.Trainer(model, optimizer, loss_fn, result.plan,
                            loss_items=lambda b: (b["labels"][:, 1:] != -100).sum())
for micro_batches in sampler.group(loader):
    trainer.step(micro_batches=micro_batches)

plan = result.plan
print(f"token budget: {plan.token_budget} padded tokens a micro-batch, buckets "
      + ", ".join(f"{b['micro_batch_size']} x {b['max_length']}" for b in plan.length_buckets))
print(f"tokens per step: {plan.tokens_per_step}, lr {plan.lr:.3g}")
print(f"padding: {100 * (1 - sampler.padding()['tokens'] / sampler.padding()['padded_tokens']):.1f} %")
print(f"trained {trainer.steps_done} steps, out-of-memory recoveries: {len(trainer.recoveries)}")
