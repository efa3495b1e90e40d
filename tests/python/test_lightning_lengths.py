"""batchtune.lightning.BatchTune(lengths=...): tunes a LightningModule LM by
the data's lengths, re-makes the train loader over a TokenBudgetSampler,
trains an epoch (every sample once, one micro-batch of the budget a step, no
out-of-memory under the emulated limit); under DDP each rank its share, the
ranks' losses weighted by their tokens."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import batchtune

pl = pytest.importorskip("lightning.pytorch")
from batchtune.lightning import BatchTune  # noqa: E402
from batchtune._lightning_tokens import ItemWeights, LongestCut, TokenBatches  # noqa: E402
from conftest import ragged_corpus  # noqa: E402
from guide_examples import guide_example, run_as_written  # noqa: E402

LIMIT = "16MiB"
LONGEST = 96
VOCAB = 50


class TinyLM(torch.nn.Module):
    """Embedding, one causal transformer layer, head: any length up to LONGEST."""

    def __init__(self, dim=32):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.pos = torch.nn.Embedding(LONGEST, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, 2, 4 * dim, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, ids):
        length = ids.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        h = self.embed(ids) + self.pos(torch.arange(length))
        return self.head(self.layer(h, src_mask=mask, is_causal=True))


def label_tokens(batch):
    return (batch["labels"][:, 1:] != -100).sum()


class LM(pl.LightningModule):
    """A causal LM on ragged samples; the train loader has no collate_fn of
    its own (BatchTune pads with batchtune.pad_collate)."""

    def __init__(self, data, batch_size=4):
        super().__init__()
        self.net = TinyLM()
        self.data = data
        self.batch_size = batch_size
        self.recording = False
        self.trained = []       # the sample indices of each training batch
        self.shapes = []

    def training_step(self, batch, batch_idx):
        if self.recording:
            self.trained.append(batch["index"].tolist())
            self.shapes.append(tuple(batch["input_ids"].shape))
        logits = self.net(batch["input_ids"])[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                 batch["labels"][:, 1:].reshape(-1), ignore_index=-100)

    def on_train_start(self):
        self.recording = True   # after BatchTune's tune

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


def ragged(n=100, seed=0):
    """Lengths skewed short, as text is; the first at the longest; each
    sample knows its index."""
    lengths, samples = ragged_corpus(n, LONGEST, VOCAB, seed=seed)
    for i, sample in enumerate(samples):
        sample["index"] = i
    return lengths, samples


def quiet_trainer(**kwargs):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


@pytest.fixture(scope="module")
def fitted():
    lengths, data = ragged()
    tuner = BatchTune(lengths="auto", memory_limit=LIMIT, time_budget=10, amp="off", report=None)
    with batchtune.emulated_memory(LIMIT):  # the fit under the budget it was tuned for
        module = LM(data)
        trainer = quiet_trainer(max_epochs=1, callbacks=[tuner])
        trainer.fit(module)  # an out-of-memory would raise here
    return dict(tuner=tuner, module=module, trainer=trainer, lengths=lengths, data=data)


def test_callback_tunes_by_lengths_and_trains_an_epoch_of_every_sample_once(fitted):
    tuner, module, trainer, lengths = (fitted[k] for k in ("tuner", "module", "trainer", "lengths"))
    plan = tuner.plan
    assert tuner.sample_lengths == lengths, "auto: read from the samples' input_ids"
    assert plan.token_budget > 0 and plan.length_buckets[-1]["max_length"] == max(lengths)
    assert tuner.result.memory_model is not None
    trained = [i for batch in module.trained for i in batch]
    assert sorted(trained) == list(range(len(lengths))), "every sample once"
    for n, length in module.shapes:
        assert n * length <= plan.token_budget
    assert max(n for n, _ in module.shapes) > 2 * min(n for n, _ in module.shapes)
    # One micro-batch of the budget a step: the module's own per-token mean.
    assert trainer.accumulate_grad_batches == 1
    assert trainer.global_step == len(module.trained) == len(tuner.token_sampler)


def test_the_trials_run_on_the_longest_samples_cut_to_each_length(fitted):
    lengths, data = fitted["lengths"], fitted["data"]
    make_batch = LongestCut(data, lengths, batchtune.pad_collate)
    batch = make_batch(5, 40)
    assert batch["input_ids"].shape == (5, 40)
    longest = [i for i in sorted(range(len(lengths)), key=lambda i: -lengths[i])][:5]
    assert sorted(batch["index"].tolist()) == sorted(longest)
    assert torch.equal(batch["input_ids"][0], data[batch["index"][0]]["input_ids"][:40])
    assert (batch["labels"] != -100).all(), "cut, not padded"
    at_longest = [i for i in range(len(lengths)) if lengths[i] == LONGEST]
    many = make_batch(len(at_longest) + 2, LONGEST)["index"].tolist()
    assert many == at_longest + at_longest[:2] if len(at_longest) > 1 else many == at_longest * 3, \
        "repeated when too few"


def test_under_ddp_each_rank_its_share_and_the_losses_weighted_by_tokens(fitted):
    lengths, plan = fitted["lengths"], fitted["tuner"].plan
    # What Lightning does under DDP: the batch sampler made again with a
    # DistributedSampler; the token sampler keeps its own share of the ranks.
    shares = []
    for rank in (0, 1):
        tokens = batchtune.TokenBudgetSampler(lengths, plan, num_replicas=2, rank=rank)
        distributed = torch.utils.data.DistributedSampler(range(len(lengths)), num_replicas=2,
                                                          rank=rank)
        shares.append(list(TokenBatches(distributed, tokens=tokens)))
    assert len(shares[0]) == len(shares[1])
    assert {i for share in shares for m in share for i in m} == set(range(len(lengths)))

    # Each rank's loss x world x its tokens / all ranks' tokens: DDP's mean of
    # the two is the per-token mean over both micro-batches.
    module = fitted["module"]
    module.recording = False
    collate = batchtune.pad_collate
    data = fitted["data"]
    batches = [collate([data[i] for i in range(1, 3)]), collate([data[i] for i in range(3, 9)])]
    counts = [float(label_tokens(b)) for b in batches]
    total = sum(counts)

    class Sum:  # the other rank's items, as all_reduce(sum) would add them
        def __init__(self, other):
            self.other = other

        def reduce(self, tensor, reduce_op):
            assert reduce_op == "sum"
            return tensor + self.other

    losses = []
    for rank, batch in enumerate(batches):
        weights = ItemWeights(Sum(counts[1 - rank]), 2, module, label_tokens)
        losses.append(weights(batch, 0))
    mean = sum(losses) / 2
    want = sum(module.training_step(b, 0) * c for b, c in zip(batches, counts)) / total
    torch.testing.assert_close(mean, want, rtol=1e-5, atol=1e-7)


def test_bad_lengths_say_which_and_how():
    with pytest.raises(batchtune.Error, match=r"lengths: a \(shortest, longest\) range"):
        BatchTune(lengths=(8, 96))
    with pytest.raises(batchtune.Error, match="lengths: 'longest' is not \"auto\""):
        BatchTune(lengths="longest")
    with pytest.raises(TypeError, match="lengths: every length must be a whole number"):
        BatchTune(lengths=[8, 1.5])
    with pytest.raises(batchtune.Error, match="target_batch: with lengths="):
        BatchTune(lengths="auto", target_batch=64)
    with pytest.raises(batchtune.Error, match="adapt: changes a batch of samples"):
        BatchTune(lengths="auto", adapt=True)
    with pytest.raises(TypeError, match="loss_items: must be a function"):
        BatchTune(lengths="auto", loss_items=3)
    with pytest.raises(batchtune.Error, match="loss_items: weighs the ranks' micro-batches"):
        BatchTune(loss_items=len)
    lengths, data = ragged(20)
    trainer = quiet_trainer(max_epochs=1, callbacks=[BatchTune(lengths=lengths[:5], memory_limit=LIMIT,
                                                               report=None)])
    with pytest.raises(batchtune.Error, match="lengths: 5 lengths for a train data set of 20"):
        trainer.fit(LM(data))


def test_callback_under_lightning_ddp_gives_each_rank_its_share(fitted, tmp_path):
    plan = fitted["tuner"].plan
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("lightning_lengths_ddp_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["replicas"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["micro_batches"] == ranks[1]["micro_batches"]
    for r in ranks:
        assert len(r["trained"]) == r["micro_batches"] == r["global_step"]
        assert r["accumulate_grad_batches"] == 1
        for n, length in r["shapes"]:
            assert n * length <= plan.token_budget
    trained = [i for r in ranks for batch in r["trained"] for i in batch]
    assert set(trained) == set(range(len(fitted["lengths"]))), "every sample on some rank"
    # Only the last round may repeat the epoch's first micro-batches.
    assert len(trained) - len(set(trained)) <= max(len(b) for r in ranks for b in r["trained"])


@pytest.mark.parametrize("marker", ["BatchTune(", "TokenBudgetSampler("])
def test_guide_lightning_and_plain_loop_examples_run_as_written(marker, tmp_path):
    out = run_as_written(guide_example(marker), tmp_path)
    assert out.strip(), "the example prints its plan"
