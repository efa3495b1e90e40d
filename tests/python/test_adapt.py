"""`Trainer(adapt=True)` and `AdaptiveBatchSampler`: the batch follows the
noise scale by the library's policy, the sampler hands out the next samples
at the size of the moment, and a resume continues the same schedule. The
policy's decisions themselves are tested in C++ (batch_adapter_test.cpp)."""
import json
import types

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import batchtune
from batchtune import _core


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def _dataset(n=4096):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, 4, generator=g)).argmax(1)
    return TensorDataset(x, y)


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def _plan(batch=16, lr=0.05):
    return batchtune.Plan(micro_batch_size=batch, accumulation_steps=1, global_batch_size=batch,
                          lr=lr, lr_scaling="sqrt", warmup_steps=0)


class _StepClock:
    """A step takes 1 s whatever its batch: a larger batch is that much faster
    per sample, so the policy has a reason to grow it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def seconds(self, samples):
        return 1.0


class _SampleClock(_StepClock):
    """A step takes its samples / 16 s: every batch is as fast per sample, so
    a smaller one, more efficient per sample, has the higher goodput."""

    def seconds(self, samples):
        return samples / 16


def _train(model, steps, clock, plan=None, state=None, sampler_state=None, every=5, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = batchtune.Trainer(model, optimizer, _loss, plan or _plan(), adapt=True,
                                adapt_every=every, clock=clock, **kwargs)
    data = _dataset()
    sampler = batchtune.AdaptiveBatchSampler(len(data), trainer, seed=3)
    if state is not None:
        trainer.load_state_dict(state)
        sampler.load_state_dict(sampler_state)
    loader = DataLoader(data, batch_sampler=sampler)
    sizes = []
    while trainer.steps_done < steps:
        for batch in loader:
            sizes.append((trainer.steps_done, len(batch[0])))
            clock.now += clock.seconds(len(batch[0]))
            trainer.step(batch)
            if trainer.steps_done >= steps:
                break
    return trainer, sampler, sizes


def test_the_batch_grows_where_it_pays_and_the_loader_follows_at_the_next_batch():
    plan = _plan()
    trainer, _, sizes = _train(_mlp(), 120, _StepClock(), plan=plan, adapt_min_batch=16)
    schedule = trainer.batch_schedule
    assert len(schedule) >= 2, "a batch 2x as fast per sample is taken"
    assert schedule[0]["step"] == 0 and schedule[0]["global_batch_size"] == 16
    assert schedule[0]["noise_scale"] is None
    for change in schedule[1:]:
        assert change["step"] % 5 == 0
        assert change["micro_batch_size"] * change["accumulation_steps"] == \
            change["global_batch_size"]
        assert 16 <= change["global_batch_size"] <= 16 * _core.DEFAULT_ADAPT_GROWTH
        assert change["noise_scale"] is not None and change["lr"] > 0 and change["reason"]
    # Every step trained at the size the schedule says, from the next batch on.
    at = {c["step"]: c["global_batch_size"] for c in schedule}
    current = None
    for step, size in sizes:
        current = at.get(step, current)
        assert size == current, (step, size, current)
    assert trainer.plan.global_batch_size == schedule[-1]["global_batch_size"]
    assert plan.global_batch_size == 16, "the caller's plan is not changed"
    assert trainer.noise_scale is not None


def test_the_tunes_speeds_keep_a_batch_it_measured_no_faster_from_being_tried():
    """The clock makes twice the batch twice as fast per sample (the test
    above grows), but the tune measured every batch at the same samples/s:
    a larger batch would then lose goodput, so none is tried; the profile
    goes into state_dict, and a resume keeps it."""
    flat = {16: 1000.0, 32: 1000.0, 64: 1000.0, 128: 1000.0}
    trainer, _, sizes = _train(_mlp(), 60, _StepClock(), adapt_min_batch=16, adapt_speeds=flat)
    assert [c["global_batch_size"] for c in trainer.batch_schedule] == [16]
    assert {size for _, size in sizes} == {16}
    policy = json.loads(trainer.state_dict()["adapt"]["policy"])
    assert {p["global_batch_size"]: p["samples_per_s"] for p in policy["speed_profile"]} == flat
    resumed = batchtune.Trainer(_mlp(), torch.optim.SGD(_mlp().parameters(), lr=0.05), _loss,
                                _plan(), adapt=True, adapt_min_batch=16)
    resumed.load_state_dict(trainer.state_dict())
    assert json.loads(resumed.state_dict()["adapt"]["policy"])["speed_profile"] == \
        policy["speed_profile"]


def test_a_tunes_speed_profile_is_its_sweep_by_global_batch():
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = _dataset(512)
    result = batchtune.tune(model, optimizer, _loss,
                            lambda n: (data.tensors[0][:n], data.tensors[1][:n]),
                            memory_limit="64MiB", max_batch=64, amp="off", report=None,
                            time_budget=60, world_size=2, base_batch=16)
    assert len(result.sweep) >= 2, "the tune swept"
    # A row's micro-batch on each of the plan's 2 ranks: the global batch,
    # its median with the interval's ends.
    profile = result.speed_profile()
    assert sorted(profile) == sorted(2 * row.batch_size for row in result.sweep)
    for row in result.sweep:
        median, low, high = profile[2 * row.batch_size]
        assert median == row.samples_per_s and 0 < low <= median <= high
        if row.samples_per_s_ci is not None:
            assert (low, high) == (min(row.samples_per_s_ci[0], median),
                                   max(row.samples_per_s_ci[1], median))
    trainer = batchtune.Trainer(model, optimizer, _loss, result.plan, adapt=True,
                                adapt_speeds=profile)
    policy = json.loads(trainer.state_dict()["adapt"]["policy"])
    assert {p["global_batch_size"]: (p["samples_per_s"], p["low"], p["high"])
            for p in policy["speed_profile"]} == profile


def test_a_batch_no_faster_per_sample_shrinks_to_adapt_min_batch_and_the_loader_follows():
    """Every batch as fast per sample: the smaller one is more efficient, so
    the batch halves (a smaller lr with it) down to adapt_min_batch and the
    loader hands out the smaller batches from the next step."""
    trainer, _, sizes = _train(_mlp(), 80, _SampleClock(), plan=_plan(32), adapt_min_batch=8)
    schedule = trainer.batch_schedule
    sizes_in_schedule = [c["global_batch_size"] for c in schedule]
    assert sizes_in_schedule[0] == 32 and min(sizes_in_schedule) == 8, schedule
    assert all(size >= 8 for size in sizes_in_schedule)
    first_shrink = next(c for c in schedule[1:] if c["global_batch_size"] < 32)
    assert first_shrink["lr"] < schedule[0]["lr"]
    at = {c["step"]: c["global_batch_size"] for c in schedule}
    current = None
    for step, size in sizes:
        current = at.get(step, current)
        assert size == current, (step, size, current)
    with pytest.raises(batchtune.Error, match="^adapt_min_batch: 33 must be a multiple"):
        _train(_mlp(), 1, _SampleClock(), plan=_plan(32), adapt_min_batch=33)


def test_the_lr_follows_the_gain_or_by_adapt_lr_the_batch_ratio():
    """The plan scales by sqrt: under "batch" a change to B takes lr0 x
    sqrt(B/16) whatever the noise; under "gain" (the default) the noise's
    share of it, E(B) < 1, makes it smaller."""
    for rule in ("gain", "batch"):
        kwargs = {} if rule == "gain" else dict(adapt_lr=rule)
        trainer, _, _ = _train(_mlp(), 60, _StepClock(), adapt_min_batch=16, **kwargs)
        change = trainer.batch_schedule[1]
        by_ratio = 0.05 * (change["global_batch_size"] / 16) ** 0.5
        if rule == "batch":
            assert change["lr"] == pytest.approx(by_ratio, rel=1e-12)
        else:
            assert 0.05 <= change["lr"] < by_ratio * (1 - 1e-6), change


def test_without_accumulation_every_step_measures_the_noise_against_the_previous_ones():
    trainer, _, _ = _train(_mlp(), 12, _StepClock(), every=1000)
    trainer._adapt._flush()
    # Splitting one step in 10 would have measured twice; successive steps
    # measure every step but the first two, for two kept copies of the
    # gradients.
    assert trainer._adapt.noise.measurements() == 10
    assert trainer._adapt.successive.holding
    assert trainer.noise_scale is not None


def test_the_sampler_hands_out_each_sample_once_an_epoch_through_changes():
    trainer = types.SimpleNamespace(plan=types.SimpleNamespace(global_batch_size=16,
                                                               world_size=1), group=None)
    sampler = batchtune.AdaptiveBatchSampler(1000, trainer, seed=0)
    seen = []
    for i, batch in enumerate(sampler):
        seen += batch
        assert len(batch) == trainer.plan.global_batch_size
        if i == 4:
            trainer.plan.global_batch_size = 64
        if i == 8:
            trainer.plan.global_batch_size = 128
    assert len(seen) == len(set(seen)), "no sample twice in an epoch"
    # 5 x 16 + 4 x 64 + 5 x 128 = 976; the 24 left make no batch of 128.
    assert len(seen) == 976
    assert sampler.epoch == 1 and sampler.offset == 0
    again = next(iter(sampler))
    assert len(again) == 128, "the next epoch starts at the size of the moment"


def test_a_resume_continues_the_same_schedule_and_weights():
    whole, _, _ = _train(_mlp(), 90, _StepClock())
    schedule = whole.batch_schedule
    assert len(schedule) >= 2
    stop = schedule[1]["step"] + 3
    model = _mlp()
    first, sampler, _ = _train(model, stop, _StepClock())
    state, sampler_state = first.state_dict(), sampler.state_dict()
    model_state = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer_state = first.optimizer.state_dict()

    resumed_model = _mlp()
    resumed_model.load_state_dict(model_state)
    optimizer = torch.optim.SGD(resumed_model.parameters(), lr=0.05)
    optimizer.load_state_dict(optimizer_state)
    clock = _StepClock()
    second = batchtune.Trainer(resumed_model, optimizer, _loss, _plan(), adapt=True,
                               adapt_every=5, clock=clock)
    data = _dataset()
    sampler2 = batchtune.AdaptiveBatchSampler(len(data), second, seed=3)
    second.load_state_dict(state)
    sampler2.load_state_dict(sampler_state)
    loader = DataLoader(data, batch_sampler=sampler2)
    while second.steps_done < 90:
        for batch in loader:
            clock.now += 1.0
            second.step(batch)
            if second.steps_done >= 90:
                break
    assert [(c["step"], c["global_batch_size"]) for c in second.batch_schedule] == \
        [(c["step"], c["global_batch_size"]) for c in schedule]
    for a, b in zip(whole.model.parameters(), resumed_model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_bad_adapt_arguments_are_refused_naming_them():
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(batchtune.Error, match="^adapt_every: must be at least 1 step, got 0$"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_every=0)
    with pytest.raises(TypeError, match="^adapt_every: must be a whole number"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_every=2.5)
    with pytest.raises(batchtune.Error, match="^adapt_max_batch:"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_max_batch=8)
    with pytest.raises(batchtune.Error, match="^adapt:"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, scale_lr=False)
    with pytest.raises(batchtune.Error, match="^adapt_lr: must be gain or batch, got 'linear'$"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_lr="linear")
    with pytest.raises(batchtune.Error, match="^adapt_lr: tunes adapt; give adapt=True"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt_lr="batch")
    with pytest.raises(batchtune.Error, match="^adapt_speeds: guides adapt; give adapt=True"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt_speeds={16: 100.0})
    with pytest.raises(TypeError, match="^adapt_speeds: must map a global batch"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_speeds=[16, 100.0])
    with pytest.raises(batchtune.Error, match="^adapt_speeds: must be at least 1, got 0$"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_speeds={0: 100.0})
    with pytest.raises(batchtune.Error, match="^adapt_speeds: the speed of global batch 16 must "
                                              r"be positive samples/s, .*; got nan$"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True,
                          adapt_speeds={16: float("nan")})
    with pytest.raises(batchtune.Error, match=r"^adapt_speeds: .* low <= median <= high; "
                                              r"got \(100.0, 120.0, 130.0\)$"):
        batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True,
                          adapt_speeds={16: (100.0, 120.0, 130.0)})
    plain = batchtune.Trainer(model, optimizer, _loss, _plan())
    adapting = batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True)
    with pytest.raises(batchtune.Error, match="^state_dict:"):
        plain.load_state_dict(adapting.state_dict())
    by_batch = batchtune.Trainer(model, optimizer, _loss, _plan(), adapt=True, adapt_lr="batch")
    with pytest.raises(batchtune.Error, match="^resume: .* by the gain rule, this one by the "
                                              "batch; resume with adapt_lr gain$"):
        by_batch.load_state_dict(adapting.state_dict())
    with pytest.raises(batchtune.Error, match="^dataset_size:"):
        batchtune.AdaptiveBatchSampler(0, adapting)


def test_no_room_for_the_gradient_copies_halves_the_micro_batch_instead_of_raising():
    # Without accumulation adapt keeps two copies of the gradients (4 MiB
    # each here), which no trial measured. Under 14 MiB the step (parameters
    # and gradients, 8 MiB) fits with one copy and not with the second: the
    # step recovers as from an out-of-memory in a micro-batch, the micro-batch
    # halved and the global batch kept, and measures without copies.
    data = _dataset(256)
    with batchtune.emulated_memory("14MiB"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.Linear(1024, 1024),
                                    torch.nn.Linear(1024, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        trainer = batchtune.Trainer(model, optimizer, _loss, _plan(16, lr=0.01), adapt=True,
                                    adapt_every=1000, clock=_StepClock())
        losses = [trainer.step((data.tensors[0][i * 16:(i + 1) * 16], data.tensors[1][i * 16:(i + 1) * 16]))
                  for i in range(4)]
    assert trainer.steps_done == 4
    assert len(trainer.recoveries) == 1, trainer.recoveries
    assert "out of memory" in trainer.recoveries[0] and "the logical batch 16 kept" in trainer.recoveries[0]
    assert trainer.micro_batch_size == 8
    assert trainer.plan.global_batch_size == 16
    assert not trainer._adapt.successive.holding  # the copies given back
    assert all(torch.isfinite(torch.tensor(loss)) for loss in losses)
    trainer._adapt._flush()
    assert trainer._adapt.noise.measurements() >= 2  # the halved steps measure their first micro-batch
