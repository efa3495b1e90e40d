"""`BatchTune(adapt=True)`: the global batch follows the noise scale inside
Lightning's loop — the train dataloader's batches follow from the step the
change takes effect at, each sample once an epoch, the lr with them, and a
resume from a Lightning checkpoint continues the same schedule. The
decisions here are scripted (the policy is tested in C++ and test_adapt.py),
except in the last tests, which run the policy on a fake clock."""
import json

import pytest
import torch

import batchtune

pl = pytest.importorskip("lightning.pytorch")
from batchtune.lightning import BatchTune  # noqa: E402

LIMIT = "16MiB"


pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n=512):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g) + 0.5 * torch.randn(n, 4, generator=g)).argmax(1)
    return torch.utils.data.TensorDataset(x, y, torch.arange(n))


class Module(pl.LightningModule):
    def __init__(self, data, batch_size=16):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 4))
        self.data = data
        self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


class StepClock:
    """One second per optimizer step, whatever its batch."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Scripted:
    """The policy, its decisions {step: global batch} written in the test."""

    def __init__(self, adapter, script):
        self._adapter, self._script = adapter, script

    def __getattr__(self, name):
        return getattr(self._adapter, name)

    def decide_on(self, step, global_batch, noise):
        if step not in self._script:
            return None
        size = self._script[step]
        micro, accumulation = self._adapter.split(size)
        return dict(step=step, global_batch_size=size, micro_batch_size=micro,
                    accumulation_steps=accumulation, lr=self._adapter.lr_for(size, 1000.0),
                    noise_scale=1000.0, reason=f"scripted at step {step}")


class Record(pl.Callback):
    """What trained: per batch the step, its size, its samples, the
    accumulation and the lr; advances the fake clock per step; with `script`
    the decisions are {step: global batch}; `save` writes a checkpoint after
    that step."""

    def __init__(self, tuner, clock, script=None, save=None):
        self.tuner, self.clock, self.script, self.save = tuner, clock, script, save
        self.batches = []

    def on_train_start(self, trainer, pl_module):
        if self.script is not None:
            adaptation = self.tuner._adapt.adaptation
            adaptation.adapter = Scripted(adaptation.adapter, self.script)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(dict(step=trainer.global_step, epoch=trainer.current_epoch,
                                 size=len(batch[0]), samples=batch[2].tolist(),
                                 accumulate=trainer.accumulate_grad_batches,
                                 lr=trainer.optimizers[0].param_groups[0]["lr"]))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.clock.now += 1.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.save and trainer.global_step == self.save[0] and \
                not trainer.fit_loop._should_accumulate():
            trainer.save_checkpoint(self.save[1])
            self.save = None

    def on_train_epoch_end(self, trainer, pl_module):
        if self.save and self.save[0] == "epoch":
            trainer.save_checkpoint(self.save[1])
            self.save = None


def _fit(steps, script=None, save=None, ckpt=None, max_batch=16, every=5, module_type=None,
         **kwargs):
    clock = StepClock()
    kwargs.setdefault("sweep", False)
    tuner = BatchTune(memory_limit=LIMIT, max_batch=max_batch, adapt=True,
                      adapt_every=every, clock=clock, time_budget=30, **kwargs)
    record = Record(tuner, clock, script, save)
    module = (module_type or Module)(_data())
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         max_steps=steps, callbacks=[tuner, record])
    trainer.fit(module, ckpt_path=ckpt)
    return tuner, record, module, trainer


def _in_force(schedule, step):
    return [c for c in schedule if c["step"] <= step][-1]


SCRIPT = {10: 32, 20: 16, 50: 64}


def test_the_batch_follows_the_decisions_from_the_next_step_the_loader_had_not_begun():
    tuner, record, _, trainer = _fit(60, SCRIPT)
    schedule = tuner.batch_schedule
    assert tuner.plan.global_batch_size == 16 and tuner.plan.micro_batch_size == 16
    assert [c["global_batch_size"] for c in schedule] == [16, 32, 16, 64]
    assert schedule[0]["step"] == 0 and schedule[0]["noise_scale"] is None
    for change, decided in zip(schedule[1:], sorted(SCRIPT)):
        # Lightning fetches one batch ahead: mostly the step after the next one
        # (the next one where a new epoch begins after the decision).
        assert decided <= change["step"] <= decided + 3, (change, decided)
        assert change["micro_batch_size"] == 16  # the tune saw 16 fit: the rest accumulates
        assert change["micro_batch_size"] * change["accumulation_steps"] == \
            change["global_batch_size"]
        assert change["reason"].startswith("scripted")
    # Every step trained the global batch in force, in micro-batches as
    # Lightning accumulated them; a step of one micro-batch is never split
    # (it measures the noise against the previous step).
    steps = {}
    for b in record.batches:
        steps.setdefault(b["step"], []).append(b)
    assert sorted(steps) == list(range(60))
    for step, parts in steps.items():
        entry = _in_force(schedule, step)
        assert sum(p["size"] for p in parts) == entry["global_batch_size"], (step, parts)
        assert all(p["accumulate"] == len(parts) for p in parts), (step, parts)
        assert len(parts) == entry["accumulation_steps"], (step, parts)
    # A measurement every step: successive steps of 16, the micro-batches of
    # larger ones (the first two steps and the two after a change of size at
    # most).
    tuner._adapt.adaptation._flush()
    assert tuner._adapt.adaptation.noise.measurements() >= 60 - 3 * len(schedule)
    assert tuner.noise_scale is not None
    # Each sample at most once an epoch, and the epoch ends where fewer than
    # a global batch are left.
    for epoch in {b["epoch"] for b in record.batches}:
        seen = [i for b in record.batches if b["epoch"] == epoch for i in b["samples"]]
        assert len(seen) == len(set(seen)), epoch
    first = [i for b in record.batches if b["epoch"] == 0 for i in b["samples"]]
    assert len(first) > 512 - 64
    assert trainer.global_step == 60


def test_the_lr_follows_the_schedule_with_a_ramp():
    tuner, record, _, _ = _fit(60, SCRIPT)
    schedule = tuner.batch_schedule
    lr = {b["step"]: b["lr"] for b in record.batches}
    assert lr[0] == pytest.approx(0.05)
    up, down, again = schedule[1:]
    assert up["lr"] > 0.05 and down["lr"] == pytest.approx(0.05) and again["lr"] > up["lr"]
    assert lr[up["step"] - 1] == pytest.approx(0.05)
    # Ramped over 20 steps: on its way at the first step of a change...
    assert 0.05 < lr[up["step"]] < up["lr"]
    ramped = 0.05 + (up["lr"] - 0.05) * (down["step"] - up["step"]) / 20
    assert lr[down["step"] - 1] == pytest.approx(ramped)
    # ... there 20 steps later.
    assert lr[again["step"] - 1] == pytest.approx(0.05)
    assert 0.05 < lr[59] < again["lr"]


@pytest.mark.parametrize("kind", ["LambdaLR", "StepLR"])
def test_your_scheduler_goes_on_times_the_gain(kind):
    """A scheduler of configure_optimizers keeps its shape: LambdaLR (from its
    base lrs) and StepLR (from the lr as it stands) both end at their lr times
    the gain of the batch."""
    def factor(step):
        return 0.5 if step >= 5 else 1.0

    class Scheduled(Module):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor) if kind == "LambdaLR" \
                else torch.optim.lr_scheduler.StepLR(optimizer, step_size=15, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler,
                                                             "interval": "step"}}

    tuner, record, _, _ = _fit(45, {10: 32}, module_type=Scheduled)
    up = tuner.batch_schedule[1]
    gain = up["lr"] / 0.05
    shape = factor if kind == "LambdaLR" else (lambda step: 0.5 ** (step // 15))
    lr = {b["step"]: b["lr"] for b in record.batches}
    assert lr[up["step"] - 1] == pytest.approx(0.05 * shape(up["step"] - 1))
    for step in range(up["step"] + 20, 45):
        assert lr[step] == pytest.approx(0.05 * shape(step) * gain), step


@pytest.mark.parametrize("at", [20, 31, "epoch"])
def test_a_resume_from_a_lightning_checkpoint_continues_the_same_schedule(tmp_path, at):
    whole, record, module, _ = _fit(60, SCRIPT)
    path = str(tmp_path / "resume.ckpt")
    # Right after the decision at step 20 (it waits for the step the loader
    # has not begun), after step 31 (the loader a batch ahead of the
    # training), at the end of the first epoch.
    _, first, _, _ = _fit(60, SCRIPT, save=(at, path))
    start = at if at != "epoch" else max(b["step"] for b in first.batches if b["epoch"] == 0) + 1
    resumed, record2, module2, trainer2 = _fit(60, SCRIPT, ckpt=path)
    assert [(c["step"], c["global_batch_size"]) for c in resumed.batch_schedule] == \
        [(c["step"], c["global_batch_size"]) for c in whole.batch_schedule]
    after = [(b["step"], b["samples"], b["accumulate"]) for b in record.batches
             if b["step"] >= start]
    again = [(b["step"], b["samples"], b["accumulate"]) for b in record2.batches]
    assert again == after, "the same samples in the same steps"
    for a, b in zip(module.parameters(), module2.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert trainer2.global_step == 60


def test_bad_adapt_arguments_are_refused_naming_them():
    # The same words as Trainer(adapt=True) and the policy's own check.
    with pytest.raises(batchtune.Error, match="^adapt_every: must be at least 1 step, got 0$"):
        BatchTune(adapt=True, adapt_every=0)
    with pytest.raises(TypeError, match="^adapt_max_batch: must be a whole number"):
        BatchTune(adapt=True, adapt_max_batch=1.5)
    with pytest.raises(batchtune.Error, match="^adapt_max_batch: must be 0 .* or more, got -4$"):
        BatchTune(adapt=True, adapt_max_batch=-4)
    with pytest.raises(batchtune.Error, match="^adapt_seed: must be at least 0, got -1$"):
        BatchTune(adapt=True, adapt_seed=-1)
    with pytest.raises(batchtune.Error, match="^adapt: moves the lr"):
        BatchTune(adapt=True, scale_lr=False)
    with pytest.raises(batchtune.Error, match="^adapt_lr: must be gain or batch, got 'sqrt'$"):
        BatchTune(adapt=True, adapt_lr="sqrt")
    with pytest.raises(batchtune.Error, match="^adapt_lr: tunes adapt; give adapt=True"):
        BatchTune(adapt_lr="gain")
    tuner = BatchTune(memory_limit=LIMIT, adapt=True)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, max_steps=1,
                         reload_dataloaders_every_n_epochs=1, callbacks=[tuner])
    with pytest.raises(batchtune.Error, match="^adapt: .*reload_dataloaders_every_n_epochs"):
        trainer.fit(Module(_data(64)))
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, max_steps=1, val_check_interval=0.5,
                         callbacks=[BatchTune(memory_limit=LIMIT, adapt=True)])
    with pytest.raises(batchtune.Error, match="^val_check_interval: 0.5 is a share"):
        trainer.fit(Module(_data(64)))
    accumulation = pl.callbacks.GradientAccumulationScheduler({0: 2})
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, max_steps=1,
                         callbacks=[BatchTune(memory_limit=LIMIT, adapt=True), accumulation])
    with pytest.raises(batchtune.Error, match="^adapt: .*GradientAccumulationScheduler"):
        trainer.fit(Module(_data(64)))


def test_the_policy_grows_the_batch_where_a_larger_one_is_faster():
    """A step takes 1 s whatever its batch: a larger micro-batch is that
    much faster per sample, so the policy tries it and keeps it."""
    tuner, record, _, _ = _fit(100, max_batch=64, target_batch=16, every=5, adapt_min_batch=16)
    schedule = tuner.batch_schedule
    assert len(schedule) >= 2, schedule
    assert schedule[1]["global_batch_size"] > schedule[0]["global_batch_size"]
    assert schedule[1]["noise_scale"] is not None


def test_the_policy_gets_the_tunes_sweep_as_its_speed_profile():
    """A batch not yet run is expected at the speed ratio the callback's own
    tune measured (as `train --adapt` after its quick tune)."""
    tuner, _, _, _ = _fit(10, max_batch=64, every=5, sweep=True)
    assert len(tuner.result.sweep) >= 2
    policy = json.loads(tuner._adapt.adaptation.adapter.state())
    assert {p["global_batch_size"]: (p["samples_per_s"], p["low"], p["high"])
            for p in policy["speed_profile"]} == tuner.result.speed_profile()


def test_adapt_lr_batch_scales_the_lr_by_the_batch_ratio_alone():
    tuner, _, _, _ = _fit(100, max_batch=64, target_batch=16, every=5, adapt_lr="batch",
                          adapt_min_batch=16)
    start, change = tuner.batch_schedule[:2]
    ratio = change["global_batch_size"] / start["global_batch_size"]
    rule = {"linear": ratio, "sqrt": ratio ** 0.5}[tuner.plan.lr_scaling]
    assert change["lr"] == pytest.approx(start["lr"] * rule, rel=1e-12)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_under_lightning_ddp_rank_0_decides_and_the_ranks_share_each_global_batch(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("lightning_adapt_ddp_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["schedule"] == ranks[1]["schedule"]
    schedule = ranks[0]["schedule"]
    assert ranks[0]["plan"]["world_size"] == 2 and schedule[0]["global_batch_size"] == 16
    assert [c["global_batch_size"] for c in schedule] == [16, 32, 16, 64]
    assert all(c["reason"].startswith("scripted") for c in schedule[1:])
    # Each step: both ranks train their half of the global batch in force,
    # in as many micro-batches, no sample on both.
    steps = [{}, {}]
    for r in (0, 1):
        for b in ranks[r]["batches"]:
            steps[r].setdefault(b["step"], []).append(b)
    assert sorted(steps[0]) == sorted(steps[1]) == list(range(35))
    for step in range(35):
        entry = _in_force(schedule, step)
        parts = [steps[r][step] for r in (0, 1)]
        assert [len(p) for p in parts][0] == len(parts[1])
        samples = [i for p in parts for b in p for i in b["samples"]]
        assert len(samples) == entry["global_batch_size"] == len(set(samples)), step
    assert ranks[0]["weights"] == ranks[1]["weights"]


# ---------------------------------------------------------------- fp16 with an optimizer that unscales itself


class FakeScaler:
    """fp16's GradScaler as Lightning's precision plugin holds it: its scale,
    kept as a tensor (`_scale`) and read with `get_scale()`."""

    def __init__(self, scale):
        self._scale = torch.tensor(float(scale))

    def get_scale(self):
        return float(self._scale)


class Plugin:
    def __init__(self, scaler):
        self.scaler = scaler


def _noise_after(steps, scales, first_scaler, step_scaler):
    """The noise scale a LightningAdaptation measures from made-up gradients,
    each step's multiplied by its loss scale (`scales`) as fp16 leaves them;
    `first_scaler(scale)` and `step_scaler(scale)` are what the callback hands
    measure_first_part and measure_step (Lightning's scaler, or None)."""
    from batchtune._lightning_adapt import LightningAdaptation
    accumulate = steps[0][2]
    plan = batchtune.Plan.make(4, target_batch=4 * accumulate)
    adaptation = LightningAdaptation(plan, 5, None, lambda: 0.0, None)
    module = torch.nn.Linear(16, 4)
    for (first, whole, _), scale in zip(steps, scales):
        adaptation.info = {"measure": True, "first": True, "accumulate": accumulate, "size": 4,
                           "step_samples": 4 * accumulate}
        if accumulate > 1:  # the first part's backward: Lightning divided its loss by the accumulation
            for p, g in zip(module.parameters(), first):
                p.grad = g * scale / accumulate
            adaptation.measure_first_part(module, first_scaler(scale))
        for p, g in zip(module.parameters(), whole):
            p.grad = g * scale
        adaptation.measure_step(module, step_scaler(scale))
    adaptation.adaptation._flush()  # the measurements queued on the device, read
    return adaptation.adaptation.noise.noise_scale()


@pytest.mark.parametrize("accumulate", [1, 4])
def test_fp16_gradients_an_optimizer_unscales_itself_are_unscaled_for_the_noise_scale(accumulate):
    g = torch.Generator().manual_seed(3)
    shapes = [(4, 16), (4,)]
    true = [torch.randn(s, generator=g) for s in shapes]
    steps = []
    for _ in range(12):
        # The whole step's gradient is nearer the true one than its first part's.
        first = [t + torch.randn(s, generator=g) for t, s in zip(true, shapes)]
        whole = [t + 0.5 * torch.randn(s, generator=g) for t, s in zip(true, shapes)]
        steps.append((first, whole, accumulate))
    none = lambda scale: None  # noqa: E731
    unscaled = _noise_after(steps, [1.0] * 12, none, none)
    assert unscaled is not None and unscaled > 0
    # fp16's scale: with accumulation, halved after a skipped step half way;
    # without, where the gradients are read step against step, moving each
    # step (what a scale taken as 1 gets wrong is the scale's change there).
    scales = [65536.0] * 6 + [32768.0] * 6 if accumulate > 1 else [65536.0, 32768.0] * 6
    scaler = FakeScaler(65536.0)
    # A fused AdamW under "16-mixed": Lightning leaves the gradients scaled.
    module = torch.nn.Linear(16, 4)
    fused = torch.optim.AdamW(module.parameters(), fused=True)
    from batchtune._lightning_adapt import still_scaled_by
    assert still_scaled_by(Plugin(scaler), fused) is scaler
    assert still_scaled_by(Plugin(scaler), type("LightningOptimizer", (), {"_optimizer": fused})()) is scaler
    assert still_scaled_by(Plugin(scaler), torch.optim.AdamW(module.parameters())) is None  # unscaled already
    assert still_scaled_by(Plugin(None), fused) is None  # bf16, fp32: no scaler
    assert _noise_after(steps, scales, FakeScaler, FakeScaler) == pytest.approx(unscaled, rel=1e-4)
    # What the callback did before: the step's gradients taken as unscaled.
    wrong = _noise_after(steps, scales, FakeScaler, none)
    assert wrong is None or wrong != pytest.approx(unscaled, rel=0.5)
