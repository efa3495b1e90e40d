"""A step of real tokens with the right gradient: `Trainer(loss_items=)`
weights each micro-batch by what its loss averages over, and
`step(micro_batches=)` takes a step's micro-batches as a token budget cuts
them. For a per-token mean over sequences of varying length the accumulated
gradient is the whole batch's; the per-sample default is not.

Run as a script under torchrun (the DDP test does), it is the job of one rank."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import batchtune

VOCAB, DIM = 50, 16
LENGTHS = [3, 20, 7, 12, 5, 16, 9, 18]
TOL = 1e-5


class TinyLM(torch.nn.Module):
    """Embedding and head: a next-token predictor small enough to check."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.embed(input_ids)))


def _sequences():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]


def _collate(sequences):
    """Padded to the longest of these sequences alone; padding is label -100."""
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    labels = torch.full((len(sequences), longest), -100, dtype=torch.long)
    for row, s in enumerate(sequences):
        ids[row, :len(s)] = s
        labels[row, :len(s)] = s
    return {"input_ids": ids, "labels": labels}


def _lm_loss(model, batch):
    """A causal LM's loss: the mean over the batch's real next tokens."""
    logits = model(batch["input_ids"])[:, :-1]
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1),
                           ignore_index=-100)


def _label_tokens(batch):
    return (batch["labels"][:, 1:] != -100).sum()


def _plan(micro, accumulation, lr=1.0):
    return batchtune.Plan(micro_batch_size=micro, accumulation_steps=accumulation,
                          global_batch_size=micro * accumulation, lr=lr, lr_scaling="none",
                          warmup_steps=0)


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _reference(model, loss_fn, batch):
    """The gradient and loss of `batch` in one forward and backward."""
    model.zero_grad()
    loss = loss_fn(model, batch)
    loss.backward()
    return _flat_grad(model).clone(), float(loss.detach())


def _trainer(model, loss_fn, plan, **kwargs):
    """A Trainer with SGD whose gradients are kept as the optimizer step
    sees them (`trainer.grads`, one flat tensor a step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=plan.lr)
    trainer = batchtune.Trainer(model, optimizer, loss_fn, plan, **kwargs)
    trainer.grads = []
    optimizer.register_step_pre_hook(
        lambda *_: trainer.grads.append(_flat_grad(trainer.model).clone()))
    return trainer


def _relative(a, b):
    return float((a - b).norm() / b.norm())


def test_a_per_token_mean_in_micro_batches_with_loss_items_is_the_whole_batchs_gradient():
    batch = _collate(_sequences())
    want, want_loss = _reference(TinyLM(), _lm_loss, batch)
    one = _trainer(TinyLM(), _lm_loss, _plan(8, 1), loss_items=_label_tokens)
    assert one.step(batch) == pytest.approx(want_loss, rel=TOL)
    assert _relative(one.grads[0], want) < TOL
    accumulated = _trainer(TinyLM(), _lm_loss, _plan(2, 4), loss_items=_label_tokens)
    loss = accumulated.step(batch)
    assert _relative(accumulated.grads[0], want) < TOL
    assert loss == pytest.approx(want_loss, rel=TOL)  # the per-token mean too


def test_uneven_micro_batches_with_loss_items_are_the_whole_batchs_gradient():
    """Micro-batches of 1, 3 and 4 sequences, each padded to its own longest,
    as a token-budget sampler hands them out."""
    sequences = _sequences()
    want, want_loss = _reference(TinyLM(), _lm_loss, _collate(sequences))
    trainer = _trainer(TinyLM(), _lm_loss, _plan(2, 4), loss_items=_label_tokens)
    loss = trainer.step(micro_batches=[_collate(sequences[:1]), _collate(sequences[1:4]),
                                       _collate(sequences[4:])])
    assert _relative(trainer.grads[0], want) < TOL
    assert loss == pytest.approx(want_loss, rel=TOL)


def test_the_per_sample_default_is_wrong_for_a_per_token_mean():
    """Without loss_items a micro-batch counts by its samples: for a
    per-token mean over sequences of varying length that is another
    gradient, so the weighting above is what makes it right."""
    sequences = _sequences()
    want, _ = _reference(TinyLM(), _lm_loss, _collate(sequences))
    by_samples = _trainer(TinyLM(), _lm_loss, _plan(2, 4))
    by_samples.step(_collate(sequences))
    assert _relative(by_samples.grads[0], want) > 0.01
    given = _trainer(TinyLM(), _lm_loss, _plan(2, 4))
    given.step(micro_batches=[_collate(sequences[:1]), _collate(sequences[1:4]),
                              _collate(sequences[4:])])
    assert _relative(given.grads[0], want) > 0.01


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)  # the mean over samples (and their 2 outputs)


@pytest.mark.parametrize("loss_items", [lambda b: b[0].shape[0], None],
                         ids=["samples_as_loss_items", "default"])
def test_a_per_sample_mean_over_uneven_micro_batches_is_the_whole_batchs_gradient(loss_items):
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)
    want, want_loss = _reference(_mlp(), _mse, (x, y))
    trainer = _trainer(_mlp(), _mse, _plan(2, 4), loss_items=loss_items)
    loss = trainer.step(micro_batches=[(x[:1], y[:1]), (x[1:4], y[1:4]), (x[4:], y[4:])])
    assert _relative(trainer.grads[0], want) < TOL
    assert loss == pytest.approx(want_loss, rel=TOL)


def test_a_micro_batch_without_label_tokens_weighs_nothing():
    """All its labels ignored: its loss is nan, its weight 0, and the step is
    the others' (gradient and loss)."""
    sequences = _sequences()
    want, want_loss = _reference(TinyLM(), _lm_loss, _collate(sequences))
    empty = _collate(sequences[:2])
    empty["labels"].fill_(-100)
    trainer = _trainer(TinyLM(), _lm_loss, _plan(2, 4), loss_items=_label_tokens)
    loss = trainer.step(micro_batches=[_collate(sequences[:3]), empty, _collate(sequences[3:])])
    assert _relative(trainer.grads[0], want) < TOL
    assert loss == pytest.approx(want_loss, rel=TOL)


def _running_out_above(samples, loss_fn):
    """`loss_fn` that runs out of memory on more than `samples` samples."""
    def loss(model, batch):
        if batch["input_ids"].shape[0] > samples:
            raise torch.OutOfMemoryError("emulated: out of memory")
        return loss_fn(model, batch)
    return loss


def test_out_of_memory_in_given_micro_batches_splits_them_and_keeps_the_gradient():
    sequences = _sequences()
    want, _ = _reference(TinyLM(), _lm_loss, _collate(sequences))
    micro_batches = [_collate(sequences[:1]), _collate(sequences[1:4]), _collate(sequences[4:])]
    trainer = _trainer(TinyLM(), _running_out_above(2, _lm_loss), _plan(2, 4),
                       loss_items=_label_tokens)
    trainer.step(micro_batches=micro_batches)
    assert _relative(trainer.grads[0], want) < TOL
    assert trainer.micro_batch_split == 2
    assert len(trainer.recoveries) == 1
    assert "out of memory at micro-batch 4" in trainer.recoveries[0]
    assert "each micro-batch in 2 pieces, the logical batch 8 kept" in trainer.recoveries[0]
    trainer.step(micro_batches=micro_batches)  # the split stays: no second out-of-memory
    assert len(trainer.recoveries) == 1
    assert trainer.state_dict()["micro_batch_split"] == 2


def test_out_of_memory_in_a_batch_with_loss_items_halves_and_keeps_the_gradient():
    batch = _collate(_sequences())
    want, _ = _reference(TinyLM(), _lm_loss, batch)
    trainer = _trainer(TinyLM(), _running_out_above(2, _lm_loss), _plan(4, 2),
                       loss_items=_label_tokens)
    trainer.step(batch)
    assert _relative(trainer.grads[0], want) < TOL
    assert trainer.micro_batch_size == 2
    assert len(trainer.recoveries) == 1 and "micro-batch 2, the logical batch 8 kept" in \
        trainer.recoveries[0]


def test_out_of_memory_at_one_sample_pieces_has_nothing_left_to_halve():
    sequences = _sequences()
    trainer = _trainer(TinyLM(), _running_out_above(0, _lm_loss), _plan(2, 4),
                       loss_items=_label_tokens)
    with pytest.raises(torch.OutOfMemoryError, match="nothing left to halve"):
        trainer.step(micro_batches=[_collate(sequences[:1]), _collate(sequences[1:4])])
    assert trainer.micro_batch_split == 4  # 3 samples: pieces of 2, then of 1
    assert len(trainer.recoveries) == 2


def test_loss_items_must_be_a_function():
    with pytest.raises(TypeError, match="loss_items: must be a function"):
        batchtune.Trainer(TinyLM(), torch.optim.SGD(TinyLM().parameters(), lr=1.0), _lm_loss,
                          _plan(2, 4), loss_items=12)


def test_loss_items_must_return_a_count():
    trainer = _trainer(TinyLM(), _lm_loss, _plan(2, 4),
                       loss_items=lambda b: (b["labels"] != -100).sum(1))
    with pytest.raises(TypeError, match=r"loss_items: must return a count .* of shape \(2,\)"):
        trainer.step(_collate(_sequences()))


def test_a_step_without_any_items_is_refused():
    batch = _collate(_sequences())
    batch["labels"].fill_(-100)
    trainer = _trainer(TinyLM(), _lm_loss, _plan(2, 4), loss_items=_label_tokens)
    with pytest.raises(batchtune.Error, match="loss_items: the step's micro-batches hold 0") as e:
        trainer.step(batch)
    assert "\n" not in str(e.value)
    assert trainer.steps_done == 0


def test_step_takes_a_batch_or_micro_batches_once():
    batch = _collate(_sequences())
    trainer = _trainer(TinyLM(), _lm_loss, _plan(2, 4))
    with pytest.raises(TypeError, match="got both"):
        trainer.step(batch, micro_batches=[batch])
    with pytest.raises(TypeError, match="got neither"):
        trainer.step()
    with pytest.raises(ValueError, match="micro_batches is empty"):
        trainer.step(micro_batches=[])
    assert trainer.steps_done == 0


def test_adapt_takes_step_batch_not_micro_batches():
    model = TinyLM()
    plan = batchtune.Plan(micro_batch_size=8, accumulation_steps=1, global_batch_size=8, lr=0.1,
                          lr_scaling="sqrt", warmup_steps=0)
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _lm_loss, plan,
                                adapt=True)
    with pytest.raises(batchtune.Error, match="micro_batches: adapt=True takes step\\(batch\\)"):
        trainer.step(micro_batches=[_collate(_sequences())])


# The two ranks' share of the 8 sequences, as micro-batches: rank 1 gives
# three where rank 0 gives two, as a token budget would.
_RANK_MICRO_BATCHES = [[(0, 2), (2, 5)], [(5, 6), (6, 7), (7, 8)]]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_two_ranks_under_ddp_get_the_global_batchs_gradient(tmp_path):
    """Ranks with different token counts and numbers of micro-batches: with
    loss_items counted over both ranks, DDP's average is the gradient of
    all 8 sequences' per-token mean, on both paths."""
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.exists(), torchrun
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", __file__,
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    want, _ = _reference(TinyLM(), _lm_loss, _collate(_sequences()))
    for rank in (0, 1):
        grads = torch.load(tmp_path / f"rank{rank}.pt")
        for path in ("micro_batches", "batch"):
            assert _relative(grads[path], want) < TOL, (rank, path)


def _ddp_job(out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sequences = _sequences()
    grads = {}
    model = torch.nn.parallel.DistributedDataParallel(TinyLM())
    trainer = _trainer(model, _lm_loss, _plan(2, 2), loss_items=_label_tokens)
    trainer.step(micro_batches=[_collate(sequences[b:e]) for b, e in _RANK_MICRO_BATCHES[rank]])
    grads["micro_batches"] = trainer.grads[0]
    model = torch.nn.parallel.DistributedDataParallel(TinyLM())
    trainer = _trainer(model, _lm_loss, _plan(2, 2), loss_items=_label_tokens)
    trainer.step(_collate(sequences[4 * rank:4 * rank + 4]))
    grads["batch"] = trainer.grads[0]
    torch.save(grads, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from conftest import exit_distributed_job

    _ddp_job(Path(sys.argv[1]))
    exit_distributed_job()
