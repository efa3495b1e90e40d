"""The memory format of a convolutional model as a measured choice:
`tune(memory_format="auto" | "channels_last" | "contiguous")` tunes the model
both ways where it has convolutions and keeps channels_last only where it
measured faster; the plan carries it and `Trainer` applies it (oneDNN honours
channels_last on the CPU, so these run there)."""
import json

import pytest
import torch
import torch.nn.functional as F

import batchtune
from batchtune._configuration import ConfigurationRun
from batchtune._memory_format import choose_memory_format, to_memory_format

LIMIT = "64MiB"


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.head(x.mean(dim=(2, 3)))


class Flat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3 * 16 * 16, 10)

    def forward(self, x):
        return self.head(x.flatten(1))


def make_batch(n):
    return torch.randn(n, 3, 16, 16), torch.randint(0, 10, (n,))


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def tune(model, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"memory_limit": LIMIT, "amp": "off", "report": None, "base_batch": 32,
              "max_batch": 64, **kwargs}
    return batchtune.tune(model, optimizer, loss_fn, make_batch, **kwargs)


def channels_last(model):
    return model.conv1.weight.is_contiguous(memory_format=torch.channels_last) and \
        not model.conv1.weight.is_contiguous()


def run(max_batch, chosen, speed, interval):
    return ConfigurationRun(max_batch, chosen, speed, interval)


def test_the_choice_keeps_channels_last_only_when_measured_faster_beyond_the_spread():
    contiguous = run(64, 32, 100.0, (95.0, 105.0))
    keep, why = choose_memory_format(contiguous, run(64, 32, 112.0, (108.0, 116.0)), "throughput")
    assert keep
    assert why == ("channels_last at 1.12x the samples/s of contiguous ([1.03x, 1.22x], batch 32 "
                   "against 32): faster beyond the measurements' spread; kept channels_last")
    keep, why = choose_memory_format(contiguous, run(64, 32, 80.0, (76.0, 84.0)), "throughput")
    assert not keep and why.endswith("slower beyond the measurements' spread; kept contiguous")
    keep, why = choose_memory_format(contiguous, run(64, 32, 103.0, (90.0, 115.0)), "throughput")
    assert not keep and why.endswith("cannot tell them apart; kept contiguous (PyTorch's default)")
    keep, why = choose_memory_format(contiguous, run(64, 32, 150.0, None), "throughput")
    assert not keep and "with no interval to judge the difference by: kept contiguous" in why
    keep, why = choose_memory_format(contiguous, run(64, 64, 90.0, None), "max-fit")
    assert not keep and why == ("channels_last; the plan takes the largest batch: kept "
                                "contiguous")


def test_auto_tunes_a_convnet_both_ways_and_the_plan_says_which_and_why():
    model = ConvNet()
    result = tune(model, memory_format="auto", time_budget=12)
    assert result.complete
    plan = result.plan
    reason = next(r for r in plan.reasons if r.startswith("channels_last at "))
    assert "x the samples/s of contiguous ([" in reason  # with its interval
    kept = plan.memory_format == "channels_last"
    assert reason.endswith("kept channels_last") == kept
    assert channels_last(model) == kept  # left as the plan keeps it
    assert ("memory_format" in plan.to_dict()) == kept
    # A plan file carries it back.
    again = batchtune.Plan.from_dict(json.loads(plan.to_json()))
    assert again.memory_format == plan.memory_format


def test_channels_last_as_asked_is_tuned_so_and_kept():
    model = ConvNet()
    seen = []

    def watching_loss(m, batch):
        seen.append(batch[0].is_contiguous(memory_format=torch.channels_last))
        return loss_fn(m, batch)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = batchtune.tune(model, optimizer, watching_loss, make_batch, memory_limit=LIMIT,
                            amp="off", report=None, base_batch=32, max_batch=64, sweep=False,
                            memory_format="channels_last")
    assert seen and all(seen)  # every trial's images in NHWC
    assert result.plan.memory_format == "channels_last" and channels_last(model)
    assert "memory_format channels_last: as asked with memory_format" in result.plan.reasons
    # contiguous as asked converts it back; left out, the model is tuned as found.
    back = tune(model, memory_format="contiguous", sweep=False)
    assert back.plan.memory_format == "contiguous" and not channels_last(model)
    model.to(memory_format=torch.channels_last)
    found = tune(model, sweep=False)
    assert found.plan.memory_format == "channels_last" and channels_last(model)
    assert any("were in it (memory_format left out)" in r for r in found.plan.reasons)


def test_a_model_without_convolutions_says_not_applicable():
    result = tune(Flat(), memory_format="auto", sweep=False)
    assert result.plan.memory_format == "contiguous"
    assert ("memory_format auto: not applicable, Flat has no Conv2d layers; kept contiguous"
            in result.plan.reasons)
    with pytest.raises(batchtune.Error, match="memory_format: Flat has no Conv2d layers"):
        tune(Flat(), memory_format="channels_last")
    with pytest.raises(batchtune.Error, match="memory_format: 'nhwc' is not one of"):
        tune(ConvNet(), memory_format="nhwc")


def test_the_trainer_applies_the_plans_memory_format_to_the_model_and_the_batch():
    model = ConvNet()
    plan = batchtune.Plan.from_dict({**batchtune.Plan.make(8).to_dict(),
                                     "memory_format": "channels_last"})
    seen = []

    def watching_loss(m, batch):
        seen.append(batch[0].is_contiguous(memory_format=torch.channels_last))
        return loss_fn(m, batch)

    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                watching_loss, plan)
    assert channels_last(model)
    loss = trainer.step(make_batch(plan.batch_size))
    assert loss > 0 and seen and all(seen)
    # And a contiguous plan leaves both alone.
    plain = ConvNet()
    batchtune.Trainer(plain, torch.optim.SGD(plain.parameters(), lr=0.1), loss_fn,
                      batchtune.Plan.make(8))
    assert not channels_last(plain)


def test_the_plan_json_carries_memory_format_only_when_channels_last_and_is_checked():
    plan = batchtune.Plan.make(8)
    assert "memory_format" not in plan.to_dict()
    with pytest.raises(batchtune.Error, match="field 'memory_format': must be \"channels_last\" "
                                              "or \"contiguous\""):
        batchtune.Plan.from_dict({**plan.to_dict(), "memory_format": "nhwc"})
    images = torch.randn(2, 3, 4, 4)
    labels = torch.tensor([1, 2])
    converted = to_memory_format({"x": images, "y": labels}, "channels_last")
    assert converted["x"].is_contiguous(memory_format=torch.channels_last)
    assert converted["y"] is labels
