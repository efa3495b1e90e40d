"""batchtune.lightning.BatchTune: tunes the LightningModule's own step with the
Trainer's optimizer on its own data, trains with the plan, leaves no trace;
under DDP every rank gets one plan."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import batchtune

from conftest import assert_bit_identical, classify_loss, small_convnet, state_copy

pl = pytest.importorskip("lightning.pytorch")
from batchtune.lightning import BatchTune  # noqa: E402

LIMIT = "16MiB"


def image_data(n=384, side=16):
    # Made before any budget: host data, not the emulated device's.
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(n, 3, side, side, generator=g),
                                          torch.randint(0, 10, (n,), generator=g))


class Module(pl.LightningModule):
    def __init__(self, data, batch_size=4):
        super().__init__()
        self.net = small_convnet()
        self.data = data
        self.batch_size = batch_size
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[0].shape[0])
        loss = classify_loss(self.net, batch)
        self.log("train_loss", loss)  # nothing during the trials
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


class Snapshot(pl.Callback):
    """The state before fit (at setup) and right after BatchTune's on_fit_start."""

    def setup(self, trainer, pl_module, stage=None):
        self.before = state_copy(pl_module, torch.optim.SGD(pl_module.parameters(), lr=0))

    def on_fit_start(self, trainer, pl_module):
        opt = trainer.optimizers[0]
        self.after_tune = state_copy(pl_module, opt)[0]
        self.optimizer_state = {k: dict(v) for k, v in opt.state.items()}
        self.seen_in_tune = len(pl_module.seen)


def quiet_trainer(**kwargs):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_callback_trains_an_epoch_at_the_plan_with_the_target_batch_by_accumulation():
    data = image_data()
    tuner = BatchTune(target_batch=128, memory_limit=LIMIT, report=None, sweep=False, max_batch=64)
    snap = Snapshot()
    with batchtune.emulated_memory(LIMIT):  # the fit under the budget it was tuned for
        module = Module(data)
        trainer = quiet_trainer(max_epochs=1, callbacks=[tuner, snap])
        trainer.fit(module)  # an out-of-memory would raise here
    plan = tuner.plan
    assert tuner.result.max_batch_size > 4
    assert module.batch_size == plan.micro_batch_size
    assert trainer.accumulate_grad_batches == plan.accumulation_steps > 1
    assert plan.micro_batch_size * plan.accumulation_steps == plan.global_batch_size == 128
    # Every training batch at the micro-batch (the epoch's last may be short).
    trained = module.seen[snap.seen_in_tune:]
    batches = math.ceil(len(data) / plan.micro_batch_size)
    assert len(trained) == batches
    assert set(trained[:-1]) == {plan.micro_batch_size}
    assert trainer.global_step == math.ceil(batches / plan.accumulation_steps)
    # Adam: the lr scaled by the square root of 128 / 4, with a warm-up.
    assert plan.lr == pytest.approx(1e-3 * math.sqrt(128 / 4))
    assert plan.warmup_steps > 0
    group = trainer.optimizers[0].param_groups[0]
    assert group["initial_lr"] == pytest.approx(plan.lr)
    assert any("warm-up" in r for r in plan.reasons)


def test_callback_leaves_no_trace():
    data = image_data()
    tuner = BatchTune(memory_limit=LIMIT, report=None, sweep=False, max_batch=64)
    snap = Snapshot()
    module = Module(data)
    trainer = quiet_trainer(max_steps=1, callbacks=[tuner, snap])
    trainer.fit(module)
    assert snap.seen_in_tune > 0  # the trials ran the module's own training_step
    assert_bit_identical(snap.before[0], snap.after_tune)
    assert snap.optimizer_state == {}  # the Adam state the trials made is gone again
    assert tuner.plan.accumulation_steps == 1 and trainer.accumulate_grad_batches == 1


def test_callback_without_a_batch_size_attribute_says_how_to_add_one():
    class NoBatchSize(Module):
        def __init__(self, data):
            super().__init__(data)
            del self.batch_size

        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.data, batch_size=8)

    trainer = quiet_trainer(max_steps=1, callbacks=[BatchTune(memory_limit=LIMIT, report=None)])
    with pytest.raises(batchtune.Error, match=r"batch_arg_name: no 'batch_size'.*self\.batch_size = "):
        trainer.fit(NoBatchSize(image_data(32)))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_callback_under_lightning_ddp_gives_both_ranks_one_plan(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("lightning_ddp_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["plan"] == ranks[1]["plan"]
    plan = ranks[0]["plan"]
    assert plan["world_size"] == 2
    # Rank 1's budget is smaller: the job trains at its choice.
    assert ranks[0]["own"] > ranks[1]["own"]
    assert plan["micro_batch_size"] <= ranks[1]["own"]
    assert plan["global_batch_size"] == plan["micro_batch_size"] * plan["accumulation_steps"] * 2 == 128
    for r in ranks:
        assert r["batch_size"] == plan["micro_batch_size"]
        assert r["accumulate_grad_batches"] == plan["accumulation_steps"]
        assert r["global_step"] >= 1


def test_callback_switches_a_32_true_trainer_to_the_mixed_precision_asked_for():
    tuner = BatchTune(amp="bf16", memory_limit=LIMIT, report=None, sweep=False, max_batch=32)
    trainer = quiet_trainer(max_steps=1, callbacks=[tuner])
    assert str(trainer.precision) == "32-true"
    trainer.fit(Module(image_data(64)))
    assert tuner.plan.amp == "bf16"
    assert str(trainer.precision) == "bf16-mixed"


def test_callback_refuses_an_amp_the_trainer_cannot_switch_to():
    tuner = BatchTune(amp="off", memory_limit=LIMIT, report=None, sweep=False, max_batch=32)
    trainer = quiet_trainer(max_steps=1, precision="bf16-mixed", callbacks=[tuner])
    with pytest.raises(batchtune.Error, match=r"amp: 'off' is not the Trainer's precision 'bf16-mixed'; pass Trainer\(precision="):
        trainer.fit(Module(image_data(64)))


def test_callback_with_configure_optimizers_returning_none_says_to_return_one():
    """Lightning trains with a stand-in optimizer (no parameter groups) when
    configure_optimizers returns None: BatchTune says so in one line, not an
    IndexError."""
    class NoOptimizer(Module):
        def configure_optimizers(self):
            return None

    trainer = quiet_trainer(max_steps=1, callbacks=[BatchTune(memory_limit=LIMIT, sweep=False,
                                                              max_batch=16)])
    with pytest.raises(batchtune.Error) as e:
        trainer.fit(NoOptimizer(image_data(32)))
    message = str(e.value)
    assert message.startswith("configure_optimizers: returned no optimizer (None)"), message
    assert "return an optimizer" in message and "\n" not in message


def test_callback_reasons_say_where_the_precision_and_the_lr_came_from(caplog):
    """Nothing asked: the amp reason names the Trainer's precision (not "as
    asked"), the lr reason the optimizer's lr (not base_lr), and no reason
    names a CLI flag."""
    import logging

    tuner = BatchTune(memory_limit=LIMIT, sweep=False, max_batch=16, target_batch=64)
    trainer = quiet_trainer(max_steps=1, callbacks=[tuner])
    with caplog.at_level(logging.INFO):
        trainer.fit(Module(image_data(64)))
    reasons = tuner.plan.reasons
    amp = next(r for r in reasons if r.startswith("amp "))
    assert amp == "amp off: the Trainer's precision '32-true'", amp
    lr = next(r for r in reasons if r.startswith("lr "))
    assert "(the optimizer's lr)" in lr and "base_lr" not in lr, lr
    for text in reasons + tuner.plan.warnings:
        assert "as asked" not in text and " --" not in text and not text.startswith("--"), text
    # Asked for: said so.
    asked = BatchTune(amp="off", memory_limit=LIMIT, sweep=False, max_batch=16, base_lr=1e-3)
    quiet_trainer(max_steps=1, callbacks=[asked]).fit(Module(image_data(64)))
    assert "amp off: as asked with amp" in asked.plan.reasons
    assert any("(base_lr)" in r for r in asked.plan.reasons), asked.plan.reasons


def test_a_sharded_strategy_is_refused_in_one_line_naming_it():
    """The callback tunes on one device, under DDP, or under Lightning's
    ModelParallelStrategy as FSDP2 alone; another sharded strategy (FSDP1,
    DeepSpeed, tensor parallelism) runs collectives its trials cannot meet
    around, so the callback refuses it before any trial."""
    import types

    from batchtune.lightning import _check_strategy

    class FSDPStrategy:  # what Lightning's FSDP and ModelParallel strategies are to it
        pass

    trainer = types.SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(batchtune.Error, match=r"^BatchTune: runs on one device or under DDP or "
                                              r"ModelParallelStrategy\(tensor_parallel_size=1\) "
                                              r"\(FSDP2 alone\), not with FSDPStrategy; use "
                                              r"strategy='ddp'") as e:
        _check_strategy(trainer, "BatchTune")
    assert "\n" not in str(e.value) and "batchtune.tune" in str(e.value)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_callback_under_model_parallel_fsdp2_tunes_in_lockstep_and_trains(tmp_path):
    """ModelParallelStrategy as FSDP2 alone (`fully_shard` in configure_model) on
    two CPU processes: the trials run on both ranks together (their gathers
    meet), one plan, and Lightning trains with it."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("lightning_fsdp_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["trials"] == ranks[1]["trials"]
    assert ranks[0]["plan"] == ranks[1]["plan"]
    plan = ranks[0]["plan"]
    assert plan["world_size"] == 2
    for r in ranks:
        assert r["batch_size"] == plan["micro_batch_size"]
        assert r["global_step"] >= 1
