"""Activation checkpointing as a measured choice: `tune(checkpointing="on" |
"auto")` over the user's blocks (`checkpoint_modules`) or a Hugging Face
model's own switch; the plan carries it, `Trainer` applies it, and the model
is left as found unless the plan keeps it."""
import json

import pytest
import torch
import torch.nn.functional as F

import batchtune
from batchtune._checkpointing import CheckpointingRun, choose_checkpointing

LIMIT = "16MiB"
WIDTH = 128


class Block(torch.nn.Module):
    """Wide activations (4x the width) for few parameters' worth: what
    checkpointing trades away."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.tanh(torch.relu(self.up(x)) * 2))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(4)])
        self.head = torch.nn.Linear(WIDTH, 10)

    def forward(self, x):
        return self.head(self.blocks(x))


def make_batch(n):
    return torch.randn(n, WIDTH), torch.randint(0, 10, (n,))


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def quick_tune(model, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"memory_limit": LIMIT, "amp": "off", "sweep": False, "report": None,
              "base_batch": 64, **kwargs}
    return batchtune.tune(model, optimizer, loss_fn, make_batch, **kwargs), optimizer


def recomputing(model):
    return [type(m).__name__ for m in model.modules() if "forward" in m.__dict__]


def test_checkpointing_on_fits_a_larger_batch_and_the_plan_keeps_it_and_trains_with_it():
    torch.manual_seed(0)
    plain, _ = quick_tune(Net())
    model = Net()
    result, optimizer = quick_tune(model, checkpointing="on", checkpoint_modules=[Block])
    # Four blocks' wide activations recomputed instead of kept.
    assert result.max_batch_size > 1.3 * plain.max_batch_size, (result.max_batch_size,
                                                                 plain.max_batch_size)
    assert result.plan.checkpointing == "on" and result.plan.checkpoint_modules == ["Block"]
    assert result.to_dict()["plan"]["checkpointing"] == "on"
    assert any("activation checkpointing on: as asked" in r for r in result.plan.reasons)
    assert recomputing(model) == ["Block"] * 4  # left on: the plan keeps it
    # A fresh model from the plan file: Trainer turns it on by class name.
    again = Net()
    plan = batchtune.Plan.from_dict(json.loads(result.plan.to_json()))
    trainer = batchtune.Trainer(again, torch.optim.SGD(again.parameters(), lr=0.1), loss_fn, plan)
    assert recomputing(again) == ["Block"] * 4
    with batchtune.emulated_memory(LIMIT):
        loss = trainer.step(make_batch(plan.batch_size))
    assert loss > 0


def test_auto_measures_both_and_says_which_it_kept_and_why_leaving_the_model_as_found():
    model = Net()
    result, _ = quick_tune(model, checkpointing="auto", checkpoint_modules=["Block"],
                           time_budget=20, sweep=True)
    reason = next(r for r in result.plan.reasons if r.startswith("checkpointing fits "))
    assert " against " in reason and "x the samples/s ([" in reason  # with its interval
    kept = result.plan.checkpointing == "on"
    assert reason.endswith("kept on") == kept
    assert recomputing(model) == (["Block"] * 4 if kept else [])
    if not kept:
        assert "checkpointing" not in result.to_dict()["plan"]


def test_a_hugging_face_model_is_checkpointed_by_its_own_switch_and_turned_off_after():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=4,
                                     n_head=2)
    model = transformers.GPT2LMHeadModel(config)

    def lm_batch(n):
        ids = torch.randint(0, 128, (n, 64))
        return {"input_ids": ids, "labels": ids}

    def lm_loss(m, batch):
        return m(**batch).loss

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = dict(memory_limit="24MiB", amp="off", sweep=False, report=None, base_batch=8)
    plain = batchtune.tune(model, optimizer, lm_loss, lm_batch, **kwargs)
    on = batchtune.tune(model, optimizer, lm_loss, lm_batch, checkpointing="on", **kwargs)
    assert on.max_batch_size > plain.max_batch_size
    assert on.plan.checkpointing == "on" and on.plan.checkpoint_modules == []
    assert model.is_gradient_checkpointing
    model.gradient_checkpointing_disable()
    # auto with the same: whichever it keeps, the model says it.
    auto = batchtune.tune(model, optimizer, lm_loss, lm_batch, checkpointing="auto",
                          time_budget=20, **kwargs)
    assert model.is_gradient_checkpointing == (auto.plan.checkpointing == "on")


@pytest.mark.parametrize("kwargs, message", [
    ({"checkpointing": "yes"}, "checkpointing: "),
    ({"checkpointing": "on"}, "checkpoint_modules: Net has no gradient_checkpointing_enable"),
    ({"checkpointing": "on", "checkpoint_modules": ["Missing"]},
     "checkpoint_modules: no module of Net is a Missing"),
    ({"checkpoint_modules": [Block]}, "checkpoint_modules: names the blocks to recompute"),
    ({"checkpointing": "on", "checkpoint_modules": [3]}, "checkpoint_modules: give module classes"),
])
def test_bad_checkpointing_arguments_say_which_and_how(kwargs, message):
    with pytest.raises(batchtune.Error, match=message):
        quick_tune(Net(), **kwargs)


def test_the_plan_json_carries_checkpointing_only_when_on_and_is_checked():
    plan = batchtune.Plan.make(8)
    assert "checkpointing" not in plan.to_dict()
    on = batchtune.Plan.from_dict({**plan.to_dict(), "checkpointing": "on",
                                   "checkpoint_modules": ["Block"]})
    assert on.checkpointing == "on" and on.to_dict()["checkpoint_modules"] == ["Block"]
    with pytest.raises(batchtune.Error, match="field 'checkpoint_modules': belongs to "
                                              "checkpointing \"on\""):
        batchtune.Plan.from_dict({**plan.to_dict(), "checkpoint_modules": ["Block"]})
    with pytest.raises(batchtune.Error, match="field 'checkpointing': must be \"on\" or \"off\""):
        batchtune.Plan.from_dict({**plan.to_dict(), "checkpointing": "maybe"})


def run(max_batch, chosen, speed, interval):
    return CheckpointingRun(max_batch, chosen, speed, interval)


def test_the_choice_keeps_checkpointing_only_when_measured_faster_beyond_the_spread():
    off = run(6, 6, 100.0, (95.0, 105.0))
    keep, why = choose_checkpointing(off, run(9, 9, 78.0, (74.0, 82.0)), "throughput")
    assert not keep
    assert why == ("checkpointing fits 9 against 6 at 0.78x the samples/s ([0.70x, 0.86x], batch "
                   "9 against 6): slower beyond the measurements' spread; kept off")
    keep, why = choose_checkpointing(off, run(9, 9, 130.0, (120.0, 140.0)), "throughput")
    assert keep and why.endswith("faster beyond the measurements' spread; kept on")
    keep, why = choose_checkpointing(off, run(9, 9, 103.0, (90.0, 115.0)), "throughput")
    assert not keep and "cannot tell them apart; kept off" in why
    keep, why = choose_checkpointing(run(0, 0, 0.0, None), run(2, 2, 5.0, None), "throughput")
    assert keep and why == "checkpointing fits 2 against 0: only with it does a batch fit; kept on"
    keep, why = choose_checkpointing(off, run(9, 9, 50.0, None), "max-fit")
    assert keep and why.endswith("the plan takes the largest batch: kept on")
    keep, why = choose_checkpointing(off, run(9, 9, 230.0, None), "throughput")
    assert not keep and why.endswith("with no interval to judge the difference by: kept off")


def test_the_hugging_face_helper_sets_gradient_checkpointing_where_the_plan_keeps_it(tmp_path):
    pytest.importorskip("transformers")
    from test_huggingface import LIMIT as HF_LIMIT, tiny_gpt2, token_data, training_args
    from batchtune.huggingface import tune_training_args

    model = tiny_gpt2()
    args = training_args(tmp_path, max_steps=1)
    tuned, result = tune_training_args(model, args, token_data(), memory_limit=HF_LIMIT,
                                       report=None, amp="off", sweep=False, return_result=True,
                                       quiet=True, checkpointing="on")
    assert result.plan.checkpointing == "on"
    name = "activation_checkpointing" if hasattr(args, "activation_checkpointing") else \
        "gradient_checkpointing"
    assert getattr(tuned, name) and not getattr(args, name)
    assert tuned.gradient_checkpointing  # the old name mirrors the new
    assert getattr(tuned, f"{name}_kwargs") == {"use_reentrant": False}


def test_a_memory_bound_tune_names_checkpointing_where_it_was_not_tried():
    torch.manual_seed(0)
    model = torch.nn.Linear(1 << 18, 4)  # 4 MiB of weights, 1 MiB an input sample

    def wide_batch(n):
        return torch.randn(n, 1 << 18), torch.randint(0, 4, (n,))

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # ~15 MiB for weights, gradients and the weight gradient at batch 1, ~0.25 MiB a sample more.
    result = batchtune.tune(model, optimizer, loss_fn, wide_batch, memory_limit="17MiB",
                            amp="off", report=None, base_batch=4, time_budget=10)
    assert 1 <= result.max_batch_size < 8
    assert result.to_dict()["diagnosis"]["kind"] == "memory-bound"
    assert result.diagnosis.endswith("; or activation checkpointing (checkpointing=\"auto\"), "
                                     "not tried")
    assert result.to_dict()["diagnosis"]["text"] == result.diagnosis


def test_the_lightning_callback_tunes_with_checkpointing_and_trains_with_it():
    pl = pytest.importorskip("lightning.pytorch")
    from batchtune.lightning import BatchTune

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(256, WIDTH, generator=g),
                                          torch.randint(0, 10, (256,), generator=g))

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Net()
            self.batch_size = 4

        def training_step(self, batch, batch_idx):
            return loss_fn(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    module = Lit()
    tuner = BatchTune(memory_limit=LIMIT, report=None, sweep=False, amp="off",
                      checkpointing="on", checkpoint_modules=[Block])
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[tuner])
    trainer.fit(module)
    assert tuner.plan.checkpointing == "on" and module.batch_size == tuner.plan.micro_batch_size
    assert recomputing(module.net) == ["Block"] * 4  # Lightning trained with it on
    assert trainer.global_step == 2
