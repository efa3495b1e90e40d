"""batchtune.huggingface on sequences of varying length: tune_training_args
tunes by the data's lengths and plans a token budget; TokenBudgetTrainer
trains an epoch by it (every sample once, no out-of-memory under the
emulated limit), its accumulated steps weighted by tokens; ragged data with
the default collator is refused in one line naming data_collator."""
import dataclasses
import math

import pytest
import torch

import batchtune

from conftest import ragged_corpus
from guide_examples import guide_example, run_as_written

transformers = pytest.importorskip("transformers")
from batchtune.huggingface import (LanguageModelPad, TokenBudgetTrainer,  # noqa: E402
                                   dataset_lengths, tune_training_args)

LIMIT = "16MiB"
LONGEST = 128
VOCAB = 100


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LONGEST, n_embd=32, n_layer=1,
                                     n_head=2, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


class Recorded(torch.utils.data.Dataset):
    """Ragged token samples that note every index the loader reads."""

    def __init__(self, samples):
        self.samples = samples
        self.seen = []

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        self.seen.append(i)
        return self.samples[i]


def ragged(n=100, seed=0):
    """Lengths skewed short, as text is; the first at the longest."""
    lengths, samples = ragged_corpus(n, LONGEST, VOCAB, mean=32, seed=seed)
    return lengths, Recorded(samples)


def training_args(out, **kwargs):
    kwargs = {"per_device_train_batch_size": 8, "learning_rate": 1e-3, **kwargs}
    return transformers.TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none",
                                          save_strategy="no", logging_strategy="no", **kwargs)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    lengths, data = ragged()
    args = training_args(out, num_train_epochs=1)
    tuned_args, result = tune_training_args(tiny_gpt2(), args, data, lengths="auto",
                                            memory_limit=LIMIT, time_budget=10, amp="off",
                                            return_result=True, quiet=True)
    return dict(args=args, tuned_args=tuned_args, result=result, lengths=lengths, data=data,
                out=out)


def test_tune_training_args_by_lengths_plans_a_token_budget(tuned):
    plan, lengths = tuned["result"].plan, tuned["lengths"]
    assert dataset_lengths(tuned["data"]) == lengths
    assert plan.token_budget > 0
    assert plan.length_buckets[-1]["max_length"] == max(lengths)
    for bucket in plan.length_buckets:
        assert bucket["micro_batch_size"] * bucket["max_length"] <= plan.token_budget
    assert tuned["result"].memory_model is not None
    # No target: one budget a process, its samples at the mean length the lr's batch.
    assert plan.tokens_per_step == plan.token_budget
    mean = sum(lengths) / len(lengths)
    assert any(f"mean length {mean:.1f}" in r for r in plan.reasons), plan.reasons
    args = tuned["tuned_args"]
    assert args.learning_rate == pytest.approx(plan.lr)
    assert args.per_device_train_batch_size == plan.micro_batch_size
    assert tuned["args"].per_device_train_batch_size == 8  # a copy; args is not changed


def test_token_budget_trainer_trains_an_epoch_without_oom_and_every_sample_once(tuned):
    plan, data = tuned["result"].plan, tuned["data"]
    with batchtune.emulated_memory(LIMIT):  # the training under the budget it was tuned for
        model = tiny_gpt2()
        trainer = TokenBudgetTrainer(model=model, args=tuned["tuned_args"], train_dataset=data,
                                     plan=plan)
        data.seen.clear()
        out = trainer.train()  # an out-of-memory would raise here
    sampler = trainer.token_sampler
    assert sorted(data.seen) == list(range(len(data))), "every sample once"
    accumulation = trainer.args.gradient_accumulation_steps
    assert accumulation == max(1, round(len(sampler) / len(sampler.steps())))
    assert out.global_step == math.ceil(len(sampler) / accumulation)
    assert math.isfinite(out.training_loss)


def test_the_train_loader_packs_micro_batches_within_the_budget(tuned):
    plan, data = tuned["result"].plan, tuned["data"]
    trainer = TokenBudgetTrainer(tiny_gpt2(), tuned["tuned_args"], train_dataset=data, plan=plan)
    loader = trainer.get_train_dataloader()
    sizes = []
    for batch in loader:
        ids = batch["input_ids"]
        assert ids.numel() <= plan.token_budget
        sizes.append(ids.shape[0])
    assert sum(sizes) == len(data)
    assert max(sizes) > 2 * min(sizes), "short samples many to a micro-batch"


def test_samples_without_labels_get_their_ids_as_labels_with_the_padding_ignored(tuned):
    trainer = TokenBudgetTrainer(tiny_gpt2(), tuned["tuned_args"], train_dataset=tuned["data"],
                                 plan=tuned["result"].plan)
    assert isinstance(trainer.data_collator, LanguageModelPad)
    batch = LanguageModelPad(pad_value=7)([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7, 8]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 7, 7], [4, 5, 6, 7, 8]]
    assert batch["labels"].tolist() == [[1, 2, 3, -100, -100], [4, 5, 6, 7, 8]]
    kept = LanguageModelPad()([{"input_ids": [1, 2], "labels": [0, 1]}, {"input_ids": [3], "labels": [1]}])
    assert kept["labels"].tolist() == [[0, 1], [1, -100]], "the samples' own labels kept"


def test_an_accumulated_step_is_weighted_by_tokens_through_num_items_in_batch(tuned):
    """Two micro-batches of different token counts: the Trainer's step
    gradient is the per-token mean over both, not the mean of their means."""
    trainer = TokenBudgetTrainer(tiny_gpt2(), tuned["tuned_args"], train_dataset=tuned["data"],
                                 plan=tuned["result"].plan)
    model = trainer.model
    collate = batchtune.pad_collate
    g = torch.Generator().manual_seed(3)
    long = collate([{"input_ids": x, "labels": x} for x in torch.randint(0, VOCAB, (2, 96), generator=g)])
    short = collate([{"input_ids": x, "labels": x} for x in torch.randint(0, VOCAB, (6, 9), generator=g)])
    batches, items = trainer.get_batch_samples(iter([long, short]), 2, torch.device("cpu"))
    assert len(batches) == 2 and items is not None
    # The label tokens the loss averages over (2 x 95 + 6 x 8 predicted), or,
    # for GPT2LMHeadModel (no loss_type) in transformers 5.x, every label (2 x
    # 96 + 6 x 9): either way one count for the whole step.
    assert int(items) in (2 * 95 + 6 * 8, 2 * 96 + 6 * 9)
    model.zero_grad()
    for batch in batches:
        trainer.training_step(model, dict(batch), items)
    got = torch.cat([p.grad.flatten() for p in model.parameters()])

    def token_losses(batch):  # every predicted token's loss, summed
        logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                 batch["labels"][:, 1:].reshape(-1), reduction="sum")

    model.zero_grad()
    (token_losses(long) + token_losses(short)).div(items).backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    model.zero_grad()
    # The mean of the micro-batches' means would weigh a short micro-batch's token more.
    counts = [2 * 95, 6 * 8]
    (token_losses(long) / counts[0] / 2 + token_losses(short) / counts[1] / 2).backward()
    means = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert not torch.allclose(got, means, rtol=1e-2)


def test_under_ddp_each_process_samples_its_own_share(tuned, monkeypatch):
    # As torchrun would set them for the second of two processes.
    monkeypatch.setattr(transformers.TrainingArguments, "world_size", property(lambda self: 2))
    monkeypatch.setattr(transformers.TrainingArguments, "process_index", property(lambda self: 1))
    plan, data = tuned["result"].plan, tuned["data"]
    trainer = TokenBudgetTrainer(tiny_gpt2(), tuned["tuned_args"], train_dataset=data, plan=plan)
    sampler = trainer.token_sampler
    assert (sampler.num_replicas, sampler.rank) == (2, 1)
    other = batchtune.TokenBudgetSampler(tuned["lengths"], plan, seed=sampler.seed,
                                         num_replicas=2, rank=0)
    assert len(other) == len(sampler)
    assert {i for m in list(sampler) + list(other) for i in m} == set(range(len(data)))
    with pytest.raises(batchtune.Error, match="average_tokens_across_devices: False"):
        TokenBudgetTrainer(tiny_gpt2(), training_args(tuned["out"], average_tokens_across_devices=False),
                           train_dataset=data, plan=plan)


def test_ragged_data_with_the_default_collator_names_data_collator(tmp_path):
    _, data = ragged(40)
    with pytest.raises(batchtune.Error) as error:
        tune_training_args(tiny_gpt2(), training_args(tmp_path), data, memory_limit=LIMIT,
                           amp="off", time_budget=5, quiet=True)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("data_collator: the samples have different lengths (8 to 128 tokens)")
    assert "default_data_collator cannot stack them" in message
    assert "DataCollatorForLanguageModeling" in message and "batchtune.pad_collate" in message
    assert 'lengths="auto"' in message


def test_bad_lengths_and_settings_say_which_and_how(tuned, tmp_path):
    model, args, data, plan = tiny_gpt2(), tuned["tuned_args"], tuned["data"], tuned["result"].plan
    with pytest.raises(batchtune.Error, match="lengths: 'longest' is not \"auto\""):
        tune_training_args(model, args, data, lengths="longest")
    with pytest.raises(batchtune.Error, match="max_position_embeddings \\(128\\)"):
        tune_training_args(model, args, data, lengths=(8, 512))
    with pytest.raises(batchtune.Error, match="lengths: 3 lengths for a train_dataset of 100"):
        TokenBudgetTrainer(model, args, train_dataset=data, plan=plan, lengths=[8, 9, 10])
    with pytest.raises(batchtune.Error, match="plan: has no token_budget"):
        TokenBudgetTrainer(model, args, train_dataset=data, plan=batchtune.Plan.make(8))
    with pytest.raises(batchtune.Error, match="auto_find_batch_size"):
        TokenBudgetTrainer(model, training_args(tmp_path, auto_find_batch_size=True),
                           train_dataset=data, plan=plan)
    with pytest.raises(batchtune.Error, match="train_dataset: sample 0 has no `input_ids`"):
        dataset_lengths([{"text": "no tokens"}])

    class NoKwargs(torch.nn.Module):  # a per-token loss the Trainer cannot weight by tokens
        def __init__(self):
            super().__init__()
            self.inner = tiny_gpt2()

        def forward(self, input_ids, labels=None):
            return self.inner(input_ids=input_ids, labels=labels)

    # Steps of several micro-batches: their means cannot be weighted alike.
    several = dataclasses.replace(plan, tokens_per_step=3 * plan.token_budget)
    with pytest.raises(batchtune.Error, match=r"model: NoKwargs.forward takes no \*\*kwargs"):
        TokenBudgetTrainer(NoKwargs(), args, train_dataset=data, plan=several)


def test_guide_hugging_face_example_runs_as_written(tmp_path):
    out = run_as_written(guide_example("TokenBudgetTrainer("), tmp_path)
    budget, planned, trained = map(int, out.split()[-3:])
    assert budget > 0 and planned >= 1 and trained >= 1
