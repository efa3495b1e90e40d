"""Sequences of varying length from Python: `tune(..., lengths=...)` runs the
core's length phase over the user's own model, the plan carries a token
budget, `TokenBudgetSampler` cuts epochs by it, and an epoch trained by it
under the emulated limit runs out of memory nowhere."""
import json

import pytest
import torch

import batchtune

from conftest import ragged_corpus


class TinyLM(torch.nn.Module):
    """A causal language model of any length: embedding, one causal
    transformer layer, head."""

    def __init__(self, vocab=50, dim=32, longest=128):
        super().__init__()
        self.vocab = vocab
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(longest, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, 2, 4 * dim, dropout=0.0,
                                                      batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        length = ids.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        h = self.embed(ids) + self.pos(torch.arange(length))
        return self.head(self.layer(h, src_mask=mask, is_causal=True))


def lm_loss(model, batch):
    """The per-token mean a Hugging Face causal LM returns: labels shifted,
    padding (-100) ignored."""
    logits = model(batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             labels.reshape(-1), ignore_index=-100)


def label_tokens(batch):
    return (batch["labels"][:, 1:] != -100).sum()


def make_lm_batch(vocab=50):
    def make_batch(n, length):
        ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(n))
        return {"input_ids": ids, "labels": ids.clone()}
    return make_batch


@pytest.fixture(scope="module")
def tuned():
    torch.manual_seed(0)
    lengths, samples = ragged_corpus(240, 96, 50)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen = []
    make = make_lm_batch()

    def make_batch(n, length):
        seen.append(length)
        return make(n, length)

    result = batchtune.tune(model, optimizer, lm_loss, make_batch, lengths=lengths,
                            memory_limit="24MiB", time_budget=20, amp="off", base_batch=8)
    return dict(result=result, seen=seen, lengths=lengths, samples=samples, model=model,
                optimizer=optimizer)


def test_tune_by_lengths_runs_the_length_phase_on_the_model_and_plans_a_token_budget(tuned):
    r, lengths = tuned["result"], tuned["lengths"]
    plan = r.plan
    assert max(tuned["seen"]) == max(lengths), "the search runs at the longest length"
    assert min(tuned["seen"]) < max(lengths), "the length phase tried shorter lengths"
    assert set(tuned["seen"]) <= set(range(min(lengths), max(lengths) + 1))
    assert plan.token_budget > 0
    assert plan.length_buckets and plan.length_buckets[-1]["max_length"] == max(lengths)
    for b in plan.length_buckets:
        assert b["micro_batch_size"] * b["max_length"] <= plan.token_budget
    assert plan.tokens_per_step == plan.token_budget, "one budget a process by default"
    assert r.memory_model is not None and r.memory_model["per_token_bytes"] > 0
    assert r.to_dict()["tokens"]["token_budget"] == plan.token_budget
    # The lr belongs to the samples a step holds at the data's mean length.
    mean = sum(lengths) / len(lengths)
    assert plan.global_batch_size == pytest.approx(plan.tokens_per_step / mean, rel=0.5)
    assert any(f"mean length {mean:.1f}" in reason for reason in plan.reasons), plan.reasons
    assert plan.lr == pytest.approx(1e-3 * (plan.global_batch_size / 8) ** 0.5, rel=1e-9)


def test_the_sampler_packs_by_the_budget_and_gives_every_sample_once(tuned):
    plan, lengths = tuned["result"].plan, tuned["lengths"]
    sampler = batchtune.TokenBudgetSampler(lengths, plan, seed=3)
    seen = []
    for micro in sampler:
        assert len(micro) * max(lengths[i] for i in micro) <= plan.token_budget
        seen += micro
    assert sorted(seen) == list(range(len(lengths)))
    assert len(sampler) == sum(sampler.steps())
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first, "set_epoch reshuffles"
    sampler.set_epoch(0)
    assert list(sampler) == first, "seeded by the epoch"
    pad = sampler.padding()
    assert pad["tokens"] == sum(lengths) and pad["padded_tokens"] >= pad["tokens"]
    # Short samples are packed many to a micro-batch.
    def most(bound):
        return max(len(m) for m in first if max(lengths[i] for i in m) == bound)
    assert most(min(lengths)) > 2 * most(max(lengths))


def test_ranks_get_the_same_count_and_the_same_steps(tuned):
    plan, lengths = tuned["result"].plan, tuned["lengths"]
    samplers = [batchtune.TokenBudgetSampler(lengths, plan, num_replicas=3, rank=r)
                for r in range(3)]
    assert len({len(s) for s in samplers}) == 1
    assert len({tuple(s.steps()) for s in samplers}) == 1
    everything = [i for s in samplers for m in s for i in m]
    assert set(everything) == set(range(len(lengths))), "every sample on some rank"
    dropped = [batchtune.TokenBudgetSampler(lengths, plan, num_replicas=3, rank=r, drop_last=True)
               for r in range(3)]
    kept = [i for s in dropped for m in s for i in m]
    assert len(kept) == len(set(kept)), "drop_last repeats nothing"
    assert len({tuple(s.steps()) for s in dropped}) == 1


def test_an_epoch_by_the_token_budget_trains_without_out_of_memory(tuned):
    r, lengths, samples = tuned["result"], tuned["lengths"], tuned["samples"]
    model, optimizer = tuned["model"], tuned["optimizer"]
    sampler = batchtune.TokenBudgetSampler(lengths, r.plan)
    loader = torch.utils.data.DataLoader(samples, batch_sampler=sampler,
                                         collate_fn=batchtune.pad_collate)
    with batchtune.emulated_memory("24MiB"):
        trainer = batchtune.Trainer(model, optimizer, lm_loss, r.plan, loss_items=label_tokens)
        losses = [trainer.step(micro_batches=step) for step in sampler.group(loader)]
    assert trainer.recoveries == [], "the budget fits at every length"
    assert len(losses) == len(sampler.steps())
    assert all(l == l for l in losses)


def test_pad_collate_pads_to_the_longest_and_labels_with_minus_100():
    out = batchtune.pad_collate([{"input_ids": [1, 2, 3], "labels": [1, 2, 3],
                                  "attention_mask": [1, 1, 1]},
                                 {"input_ids": [4], "labels": [4], "attention_mask": [1]}])
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert out["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    x, y = batchtune.pad_collate([(torch.tensor([1, 2]), torch.tensor(0)),
                                  (torch.tensor([3]), torch.tensor(1))])
    assert x.tolist() == [[1, 2], [3, 0]] and y.tolist() == [0, 1]


CLI_TOKEN_PLAN = {
    "micro_batch_size": 11, "accumulation_steps": 1, "world_size": 1, "global_batch_size": 11,
    "lr": 0.001, "lr_scaling": "sqrt", "warmup_steps": 0, "amp": "off", "workers": 0,
    "pin_memory": False, "prefetch": 2, "eval_micro_batch_size": 0, "reasons": [],
    "warnings": [], "workload": {"model": "gpt", "input": "int64:16..512", "optimizer": "adam",
                                 "base_lr": 0.001, "base_batch": 64, "device": "cpu",
                                 "memory_limit_bytes": 0},
    "token_budget": 5632, "length_buckets": [{"max_length": 16, "micro_batch_size": 352},
                                             {"max_length": 512, "micro_batch_size": 11}]}


def test_plan_load_reads_the_cli_s_token_plans_old_and_new(tmp_path):
    old = tmp_path / "seq.json"
    old.write_text(json.dumps({"plan": CLI_TOKEN_PLAN}))
    plan = batchtune.Plan.load(str(old))
    assert plan.token_budget == 5632 and plan.length_buckets[1]["micro_batch_size"] == 11
    assert plan.tokens_per_step == 0, "a plan of an older batchtune: the budget a step"
    assert batchtune.TokenBudgetSampler([16, 512, 20], plan).tokens_per_step == 5632
    new = tmp_path / "new.json"
    new.write_text(json.dumps(dict(CLI_TOKEN_PLAN, tokens_per_step=9000)))
    assert batchtune.Plan.load(str(new)).tokens_per_step == 9000
    assert batchtune.Plan.from_dict(plan.to_dict()) == plan
    fixed = batchtune.Plan.make(8)
    assert "token_budget" not in fixed.to_dict(), "as the CLI writes a plan of fixed batches"
    assert batchtune.Plan.from_dict(fixed.to_dict()) == fixed


def test_bad_lengths_and_plans_say_which_and_how(tuned):
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad, kind, words in [("abc", TypeError, "lengths"), ([], batchtune.Error, "empty"),
                             ([4, 0], batchtune.Error, "at least 1"),
                             ((64, 8), batchtune.Error, "shortest above"),
                             ([1.5], TypeError, "whole number")]:
        with pytest.raises(kind, match=words):
            batchtune.tune(model, opt, lm_loss, make_lm_batch(), lengths=bad, memory_limit="16MiB")
    with pytest.raises(batchtune.Error, match="no token_budget"):
        batchtune.TokenBudgetSampler([4, 5], batchtune.Plan.make(4))
    with pytest.raises(batchtune.Error, match="longer than the plan's longest bucket"):
        batchtune.TokenBudgetSampler([4, 5000], tuned["result"].plan)
    with pytest.raises(batchtune.Error, match="rank: must be below"):
        batchtune.TokenBudgetSampler([4, 5], tuned["result"].plan, num_replicas=2, rank=2)
