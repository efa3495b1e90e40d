"""Issue #51, "Trust, round four": every epoch under Lightning's adapt trains
its samples, a resume with loader workers trains every sample of the epoch
once, a data set smaller than the global batch is refused, and the Trainer's
and the sampler's arguments are checked where they enter, each refusal one
line naming the argument."""
import collections
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import batchtune
from batchtune import _core

LIMIT = "16MiB"


pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    return TensorDataset(x, y, torch.arange(n))


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _loss(model, batch):
    x, y = batch[0], batch[1]
    return torch.nn.functional.cross_entropy(model(x), y)


def _plan(batch=8):
    return batchtune.Plan(micro_batch_size=batch, accumulation_steps=1, global_batch_size=batch,
                          lr=0.05, lr_scaling="sqrt", warmup_steps=0)


def _trainer(plan=None, **kwargs):
    model = _mlp()
    return batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), _loss,
                             plan or _plan(), **kwargs)


def _one_line(info):
    message = str(info.value)
    assert "\n" not in message, message
    return message


# -- 1. Lightning adapt: every epoch trains -------------------------------------


pl = None
try:
    import lightning.pytorch as pl  # noqa: F811
except ImportError:
    pass

needs_lightning = pytest.mark.skipif(pl is None, reason="Lightning is not installed")


def _module_type():
    class Module(pl.LightningModule):
        def __init__(self, data):
            super().__init__()
            self.net = _mlp()
            self.data = data
            self.batch_size = 16

        def training_step(self, batch, batch_idx):
            return _loss(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self):
            return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    return Module


def _lightning_trainer(callbacks, **kwargs):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=callbacks, **kwargs)


@needs_lightning
@pytest.mark.parametrize("max_batch", [64, 48])
def test_lightning_adapt_trains_the_samples_of_every_epoch(max_batch):
    """The manual's example, smaller: the loader had BatchSampler's length
    (the data set / the micro-batch), so Lightning ended each epoch without
    finishing the order's iterator and the next epoch began at what was left
    of the last one: every second epoch trained nothing."""
    from batchtune.lightning import BatchTune

    class Samples(pl.Callback):
        def __init__(self):
            self.by_epoch = collections.defaultdict(list)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.by_epoch[trainer.current_epoch] += batch[2].tolist()

    samples = Samples()
    tuner = BatchTune(memory_limit=LIMIT, max_batch=max_batch, sweep=False, time_budget=30,
                      adapt=True, adapt_every=50)
    trainer = _lightning_trainer([tuner, samples], max_epochs=4)
    trainer.fit(_module_type()(_data(256)))
    batch = tuner.plan.global_batch_size
    assert [c["global_batch_size"] for c in tuner.batch_schedule] == [batch]
    steps = 256 // batch
    assert steps >= 2
    for epoch in range(4):
        seen = samples.by_epoch[epoch]
        assert len(seen) == steps * batch, (epoch, len(seen), dict(samples.by_epoch))
        assert len(set(seen)) == len(seen), epoch
    assert trainer.global_step == 4 * steps


# -- 3. a resume with loader workers ----------------------------------------


def _train_epoch_part(trainer, sampler, data, stop=None, **loader_kwargs):
    """Trains from where the sampler stands to the end of its epoch, or
    `stop` steps; returns the samples trained."""
    loader = DataLoader(data, batch_sampler=sampler, **loader_kwargs)
    seen = []
    for batch in loader:
        seen += batch[2].tolist()
        trainer.step(batch)
        if stop is not None and trainer.steps_done == stop:
            break
    del loader  # its workers go
    return seen


def test_a_resume_with_workers_trains_every_sample_of_the_epoch_once():
    """The loader's workers fetched batches ahead of the training (2 workers x
    prefetch 2); the state counts the batches the trainer stepped on, so the
    resume hands out again those fetched and not trained."""
    data = _data(512)
    workers = dict(num_workers=2, prefetch_factor=2)
    first = _trainer(adapt=True, adapt_every=1000)
    sampler = batchtune.AdaptiveBatchSampler(len(data), first, seed=3)
    before = _train_epoch_part(first, sampler, data, stop=23, **workers)
    assert len(before) == 23 * 8
    assert sampler.offset > 23 * 8, "the loader had asked ahead of the training"
    state, sampler_state = first.state_dict(), sampler.state_dict()
    assert sampler_state == dict(epoch=0, offset=23 * 8, seed=3)

    second = _trainer(adapt=True, adapt_every=1000)
    resumed = batchtune.AdaptiveBatchSampler(len(data), second, seed=3)
    second.load_state_dict(state)
    resumed.load_state_dict(sampler_state)
    after = _train_epoch_part(second, resumed, data, **workers)
    assert sorted(before + after) == list(range(512)), "every sample of the epoch, once"
    assert second.steps_done == 512 // 8
    # The epoch ended and trained whole: the next one from its start.
    assert resumed.state_dict() == dict(epoch=1, offset=0, seed=3)


def test_the_sampler_state_takes_the_batches_trained_when_the_loop_counts_them():
    """A loop that trains on the batches otherwise than one `trainer.step`
    each says how many of the pass's batches trained."""
    trainer = _trainer(adapt=True, adapt_every=1000)
    sampler = batchtune.AdaptiveBatchSampler(64, trainer, shuffle=False)
    batches = iter(sampler)
    for _ in range(5):
        next(batches)
    assert sampler.state_dict() == dict(epoch=0, offset=0, seed=0), "no step yet"
    assert sampler.state_dict(batches_trained=3) == dict(epoch=0, offset=24, seed=0)
    assert sampler.state_dict(batches_trained=5) == dict(epoch=0, offset=40, seed=0)
    with pytest.raises(batchtune.Error, match="^batches_trained: must be at least 0, got -1$"):
        sampler.state_dict(batches_trained=-1)


# -- 13. a data set smaller than the global batch ---------------------------


def test_a_data_set_smaller_than_the_global_batch_is_refused():
    trainer = _trainer(adapt=True)
    with pytest.raises(batchtune.Error) as info:
        batchtune.AdaptiveBatchSampler(5, trainer)
    assert _one_line(info) == (
        "dataset_size: 5 samples are fewer than the global batch of 8, so an epoch trains no "
        "step; give a data set of at least 8 samples, or a plan with a smaller global batch")
    assert len(batchtune.AdaptiveBatchSampler(8, trainer)) == 1, "one whole batch is a step"


@needs_lightning
@pytest.mark.parametrize("adapt", [True, False])
def test_lightning_refuses_a_target_batch_larger_than_the_data_set(adapt):
    from batchtune.lightning import BatchTune

    tuner = BatchTune(memory_limit=LIMIT, target_batch=1000, sweep=False, time_budget=30,
                      adapt=adapt)
    trainer = _lightning_trainer([tuner], max_epochs=1)
    with pytest.raises(batchtune.Error) as info:
        trainer.fit(_module_type()(_data(256)))
    assert _one_line(info) == (
        "target_batch: the global batch 1000 is larger than the 256 samples of "
        "train_dataloader()'s data set, so an epoch trains no whole step; give "
        "target_batch=256 or less")
    assert tuner.result is None, "refused before the tune"


@needs_lightning
def test_lightning_refuses_a_checkpoints_plan_larger_than_the_data_set():
    from batchtune.lightning import BatchTune

    tuner = BatchTune(memory_limit=LIMIT, adapt=True)
    tuner.load_state_dict({"plan": batchtune.Plan.make(250, target_batch=1000).to_dict()})
    trainer = _lightning_trainer([tuner], max_epochs=1)
    with pytest.raises(batchtune.Error, match=r"^plan: the checkpoint's global batch 1000 is "
                                              r"larger than the 256 samples"):
        trainer.fit(_module_type()(_data(256)))


# -- 17. arguments checked where they enter --------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(adapt=True, adapt_every=10 ** 20), batchtune.Error,
     "adapt_every: must be in [1, 1099511627776] optimizer steps, got 100000000000000000000"),
    (dict(adapt=True, adapt_every=-10 ** 20), batchtune.Error,
     "adapt_every: must be in [1, 1099511627776] optimizer steps, got -100000000000000000000"),
    (dict(adapt=True, adapt_max_batch=2 ** 62), batchtune.Error,
     "adapt_max_batch: must be in [0, 1099511627776] samples (None or 0: 32 x the starting "
     "batch), got 4611686018427387904"),
    (dict(adapt=True, adapt_min_batch=2 ** 62), batchtune.Error,
     "adapt_min_batch: must be in [0, 1099511627776] samples (None or 0: the starting batch / "
     "32), got 4611686018427387904"),
    (dict(adapt=True, adapt_lr=1), TypeError,
     "adapt_lr: must be \"gain\" or \"batch\" (a str), got 1"),
    (dict(adapt_every=10), batchtune.Error,
     "adapt_every: tunes adapt; give adapt=True, or leave it out"),
    (dict(adapt_max_batch=64), batchtune.Error,
     "adapt_max_batch: tunes adapt; give adapt=True, or leave it out"),
    (dict(adapt_min_batch=4), batchtune.Error,
     "adapt_min_batch: tunes adapt; give adapt=True, or leave it out"),
    (dict(adapt_lr="gain"), batchtune.Error,
     "adapt_lr: tunes adapt; give adapt=True, or leave it out"),
    (dict(adapt="no"), TypeError, "adapt: must be True or False, got 'no'"),
    (dict(adapt=1), TypeError, "adapt: must be True or False, got 1"),
])
def test_the_trainers_adapt_arguments_are_refused_naming_them(kwargs, error, message):
    with pytest.raises(error) as info:
        _trainer(**kwargs)
    assert type(info.value) is error
    assert _one_line(info) == message


def test_the_trainers_adapt_arguments_at_the_bound_are_taken():
    trainer = _trainer(adapt=True, adapt_every=2 ** 40, adapt_max_batch=2 ** 40)
    assert trainer._adapt.every == 2 ** 40
    assert _trainer()._adapt is None
    assert _trainer(adapt=False)._adapt is None


@needs_lightning
def test_the_callbacks_adapt_arguments_are_refused_as_the_trainers():
    from batchtune.lightning import BatchTune

    with pytest.raises(batchtune.Error, match=r"^adapt_every: tunes adapt; give adapt=True, or "
                                              r"leave it out$"):
        BatchTune(adapt_every=10)
    with pytest.raises(TypeError, match="^adapt: must be True or False, got 'no'$"):
        BatchTune(adapt="no")
    with pytest.raises(batchtune.Error, match=r"^adapt_max_batch: must be in \[0, 1099511627776\]"):
        BatchTune(adapt=True, adapt_max_batch=2 ** 62)
    assert BatchTune(adapt=True).adapt_every == _core.DEFAULT_ADAPT_EVERY


def test_a_plan_that_is_no_plan_is_refused():
    with pytest.raises(TypeError) as info:
        batchtune.Trainer(_mlp(), torch.optim.SGD(_mlp().parameters(), lr=0.05), _loss, None)
    assert _one_line(info) == ("plan: must be a batchtune.Plan (result.plan, Plan.make(...) or "
                               "Plan.load(path)), got NoneType")


def test_a_sampler_without_a_trainer_is_refused():
    with pytest.raises(TypeError) as info:
        batchtune.AdaptiveBatchSampler(100, None)
    assert _one_line(info) == ("trainer: give the batchtune.Trainer that trains on the batches "
                               "(Trainer(..., adapt=True)), got NoneType")


def _edited(state, path, value):
    """A copy of `state` with the field at `path` set to `value`, or taken
    out where `value` is `_GONE`."""
    import copy

    state = copy.deepcopy(state)
    *parents, key = path
    target = state
    for p in parents:
        target = target[p]
    if value is _GONE:
        del target[key]
    else:
        target[key] = value
    return state


_GONE = object()


@pytest.mark.parametrize("path, value, error, message", [
    (("micro_batch_size",), 0, batchtune.Error,
     "state_dict['micro_batch_size']: must be at least 1, got 0"),
    (("micro_batch_size",), 2.5, TypeError,
     "state_dict['micro_batch_size']: must be a whole number (an int), got 2.5"),
    (("steps_done",), -1, batchtune.Error, "state_dict['steps_done']: must be at least 0, got -1"),
    (("steps_done",), _GONE, batchtune.Error,
     "state_dict: has no 'steps_done'; give the dict Trainer.state_dict() returned"),
    (("micro_batch_split",), 0, batchtune.Error,
     "state_dict['micro_batch_split']: must be at least 1, got 0"),
    (("plan", "lr"), -1, batchtune.Error,
     "state_dict['plan']: field 'lr': must be a positive number, got -1.0"),
    (("plan", "lr"), math.nan, batchtune.Error,
     "state_dict['plan']['lr']: must be a finite number (positive), got nan"),
    (("plan", "lr"), "0.1", TypeError,
     "state_dict['plan']['lr']: must be a number (positive), got '0.1'"),
    (("plan", "micro_batch_size"), 0, batchtune.Error,
     "state_dict['plan']: field 'micro_batch_size': must be at least 1, got 0"),
    (("plan", "global_batch_size"), 12, batchtune.Error,
     "state_dict['plan']: field 'global_batch_size': must be micro_batch_size x "
     "accumulation_steps x world_size = 8, got 12"),
    (("plan", "accumulation_steps"), _GONE, batchtune.Error,
     "state_dict['plan']: has no 'accumulation_steps'; give the dict Trainer.state_dict() "
     "returned"),
    (("plan",), None, TypeError,
     "state_dict['plan']: give the dict Trainer.state_dict() returned, got NoneType"),
    (("adapt", "noise"), _GONE, batchtune.Error,
     "state_dict['adapt']: has no 'noise'; give the dict state_dict() returned"),
    (("adapt", "policy"), None, TypeError,
     "state_dict['adapt']['policy']: must be the JSON text state_dict() returned, got NoneType"),
    (("adapt", "ramp_start"), "3", TypeError,
     "state_dict['adapt']['ramp_start']: must be a whole number (an int), got '3'"),
])
def test_a_bad_trainer_state_is_refused_naming_the_field_and_changes_nothing(path, value, error,
                                                                           message):
    saved = _trainer(adapt=True).state_dict()
    trainer = _trainer(adapt=True)
    before = trainer.state_dict()
    with pytest.raises(error) as info:
        trainer.load_state_dict(_edited(saved, path, value))
    assert type(info.value) is error
    assert _one_line(info) == message
    assert trainer.state_dict() == before


def test_a_trainer_state_that_is_no_dict_is_refused():
    trainer = _trainer(adapt=True)
    with pytest.raises(TypeError) as info:
        trainer.load_state_dict(None)
    assert _one_line(info) == ("state_dict: give the dict Trainer.state_dict() returned, got "
                               "NoneType")
    # A good state still loads.
    trainer.load_state_dict(_trainer(adapt=True).state_dict())


def _convnet_tune():
    from conftest import classify_loss, image_batch, small_convnet
    torch.manual_seed(0)
    model = small_convnet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    make_batch = image_batch((3, 16, 16))

    def tune():
        return batchtune.tune(model, optimizer, classify_loss, make_batch, memory_limit="24MiB",
                              amp="off", sweep=False, report=None)

    def probe(n):
        return batchtune.probe(model, optimizer, classify_loss, make_batch, batch_size=n,
                               memory_limit="24MiB", amp="off", steps=1, min_time=0)
    return tune, probe


def test_an_answer_does_not_depend_on_what_the_process_holds_and_fits_when_probed_again():
    """Item 8: on the emulated device, tensors the process made after the
    budget was installed (the data, what earlier code left) counted against
    it, so a tune's answer shrank with what ran before it (2924 alone, 1434
    in the whole suite) and a probe of the answer right after the tune could
    fail. The device holds the model, the optimizer and the steps alone."""
    tune, probe = _convnet_tune()
    alone = tune()
    assert alone.complete and alone.max_batch_size >= 8, alone.reason
    # 12 MiB of the process's own tensors, half the emulated device, made
    # after the budget was installed: host memory, as beside a GPU.
    held = [torch.ones(3 << 20) for _ in range(1)]
    assert _core.budget_installed()
    crowded = tune()
    assert crowded.max_batch_size == alone.max_batch_size, (alone.trials, crowded.trials)
    # More made between the tune and the probe, and garbage in a cycle.
    held.append(torch.ones(2 << 20))
    cycle = [torch.ones(1 << 20)]
    cycle.append(cycle)
    del cycle
    again = probe(alone.max_batch_size)
    assert again.fits, again.error
    at_answer = [t for t in alone.trials if t.batch_size == alone.max_batch_size and t.fits]
    assert again.peak_bytes == pytest.approx(at_answer[-1].peak_bytes, rel=1e-3)
    assert held[0].sum().item() == 3 << 20  # held to the end
