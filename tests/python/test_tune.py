"""tune on the CPU under an emulated budget: the maximum it returns fits, and
3 % above it does not; the rest of the pipeline (sweep, choice, plan, JSON,
HTML) from Python."""
import json
import math

import pytest
import torch

import batchtune

from conftest import (TinyTransformer, classify_loss, image_batch, small_convnet,
                      transformer_batch, transformer_loss)


def _max_fits_and_three_percent_above_does_not(model, optimizer, loss_fn, make_batch, limit):
    result = batchtune.tune(model, optimizer, loss_fn, make_batch, memory_limit=limit,
                            sweep=False, report=None, amp="off")
    assert result.complete
    best = result.max_batch_size
    assert best >= 4, result.trials
    at = batchtune.probe(model, optimizer, loss_fn, make_batch, batch_size=best,
                         memory_limit=limit, steps=1, min_time=0)
    assert at.fits, at.error
    above = batchtune.probe(model, optimizer, loss_fn, make_batch,
                            batch_size=math.ceil(best * 1.03), memory_limit=limit, steps=1, min_time=0)
    assert not above.fits
    assert above.failure in ("out_of_memory", "over_budget")
    return result


def test_torchvision_resnet18_max_fits_and_3_percent_above_does_not():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # 11.2 M parameters: weights, momentum and grads take ~134 MiB; the rest is
    # activations at 3x32x32.
    r = _max_fits_and_three_percent_above_does_not(model, optimizer, classify_loss,
                                                   image_batch((3, 32, 32)), "160MiB")
    assert r.trials[-1].peak_bytes <= r.trials[-1].usable_bytes or not r.trials[-1].fits


def test_small_transformer_max_fits_and_3_percent_above_does_not():
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _max_fits_and_three_percent_above_does_not(model, optimizer, transformer_loss,
                                               transformer_batch(model), "24MiB")


def test_full_tune_gives_sweep_choice_plan_report_and_the_cli_json_fields(tmp_path):
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    report = tmp_path / "tune.html"
    r = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                       memory_limit="32MiB", target_batch=512, report=str(report), amp="off",
                       max_batch=256, time_budget=60)
    assert r.complete
    assert 0 < r.chosen_batch_size <= r.max_batch_size
    assert [row.batch_size for row in r.sweep] == sorted(row.batch_size for row in r.sweep)
    plan = r.plan
    assert plan.micro_batch_size <= r.chosen_batch_size
    assert plan.global_batch_size == plan.micro_batch_size * plan.accumulation_steps
    if plan.micro_batch_size < r.chosen_batch_size:  # a smaller one taken to reach 512 exactly
        assert plan.global_batch_size == 512, plan.reasons
    assert abs(plan.global_batch_size - 512) <= plan.micro_batch_size
    # The evaluation batch: forward only, at least the micro-batch, in the
    # JSON and in the DataLoader arguments; the model back in train mode.
    assert r.eval_batch_size >= plan.micro_batch_size
    assert plan.eval_micro_batch_size == r.eval_batch_size
    assert plan.dataloader_kwargs(eval=True)["batch_size"] == r.eval_batch_size
    assert model.training
    assert plan.lr_scaling == "linear"  # SGD
    assert plan.amp == "off"
    kwargs = plan.dataloader_kwargs()
    assert kwargs["batch_size"] == plan.micro_batch_size * plan.accumulation_steps
    assert set(kwargs) == {"batch_size", "num_workers", "pin_memory", "prefetch_factor",
                           "persistent_workers"}
    torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 1)), **kwargs)
    d = r.to_dict()
    for field in ("max_batch_size", "search", "trials", "sweep", "chosen_batch_size",
                  "objective", "diagnosis", "complete", "plan", "loader", "loader_note"):
        assert field in d, field
    assert d["max_batch_size"] == r.max_batch_size
    assert d["eval_search"]["max_batch_size"] == r.eval_batch_size
    assert d["chosen_batch_size"] == r.chosen_batch_size
    assert d["plan"]["micro_batch_size"] == plan.micro_batch_size
    assert batchtune.Plan.from_dict(d) == plan  # the C++ plan reader accepts it
    json.dumps(d)
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") or "<html" in html
    assert "<svg" in html


def test_bad_arguments_say_which_and_how():
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(batchtune.Error, match="objective"):
        batchtune.tune(model, optimizer, classify_loss, image_batch(), objective="fastest")
    with pytest.raises(batchtune.Error, match="margin"):
        batchtune.probe(model, optimizer, classify_loss, image_batch(), margin=1.5,
                        memory_limit="64MiB")
    with pytest.raises(batchtune.Error, match="optimizer"):
        batchtune.probe(model, None, classify_loss, image_batch())
    with pytest.raises(batchtune.Error, match="memory_limit"):
        batchtune.probe(model, optimizer, classify_loss, image_batch(), memory_limit="1KiB")


def test_tune_is_the_library_pipeline_with_the_cli_json(tmp_path):
    """One pipeline: the JSON is `batchtune tune --json`'s, with the time budget
    of the whole run, the phases it spent, the precision chosen first and the
    utilization monitor's fields."""
    model = small_convnet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                       memory_limit="32MiB", report=None, amp="off", max_batch=128,
                       time_budget=8)
    d = r.to_dict()
    assert d["time_budget_s"] == 8
    assert {"search", "sweep", "plan"} <= set(d["phase_seconds"])
    assert d["amp"] == "off" and d["amp_reason"] == "amp off: as asked with amp"
    assert d["amp_confidence"] == 1.0  # asked for, nothing measured
    assert "precision" in d["phase_seconds"]  # inside the budget, even when it took nothing
    assert d["selection"]["confidence"] == "inconclusive" or 0 < d["selection"]["confidence"] <= 1
    for row in d["sweep"]:
        low, high = row["samples_per_s_ci"]
        assert low <= row["samples_per_s"] <= high
        assert isinstance(row["noisy"], bool)
    assert r.sweep[0].samples_per_s_ci is not None
    assert d["threads"] == torch.get_num_threads()
    # The monitor ran (on the CPU: this process's CPU time, and no GPU).
    assert d["utilization_note"] and "no GPU" in d["utilization_note"]
    assert "GPU utilization unavailable" in d["utilization_details"]
    assert d["sweep"] and all("utilization" in row for row in d["sweep"])
    assert d["loader"] == [] and "make_batch" in d["loader_note"]
    assert d["plan"]["lr_scaling"] == "sqrt"  # AdamW's default
    assert r.plan.reasons[0].startswith(f"micro-batch {r.chosen_batch_size}:")
    assert d["search"]["stop_reason"]


def test_amp_auto_is_chosen_first_by_a_measured_step():
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                       memory_limit="32MiB", report=None, amp="auto", max_batch=64,
                       sweep=False)
    d = r.to_dict()
    assert d["amp"] in ("off", "bf16")
    assert "interleaved rounds" in d["amp_reason"], d["amp_reason"]
    assert d["amp_confidence"] == "inconclusive" or d["amp_confidence"] >= 0.95
    assert d["phase_seconds"]["precision"] > 0
    assert r.plan.amp == d["amp"]
    assert all(t["amp"] == d["amp"] for t in d["trials"])  # every trial at that precision
    with pytest.raises(batchtune.Error, match="amp: fp16 autocast is for CUDA"):
        batchtune.tune(model, optimizer, classify_loss, image_batch(), memory_limit="32MiB",
                       amp="fp16", report=None)


def test_sweep_false_plans_the_largest_batch_and_no_fit_names_python_arguments():
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch(), memory_limit="64MiB",
                       max_batch=64, sweep=False, report=None, amp="off", target_batch=128)
    assert r.sweep == [] and r.chosen_batch_size == r.max_batch_size == r.plan.micro_batch_size
    assert "no sweep" in r.reason
    assert r.plan.lr_scaling == "linear"  # SGD's default
    assert not any("--" in reason for reason in r.plan.reasons), r.plan.reasons  # no CLI flags
    with pytest.raises(batchtune.Error) as e:
        batchtune.tune(model, optimizer, classify_loss, image_batch((3, 512, 512)),
                       memory_limit="2MiB", report=None, amp="off", margin=0)
    assert str(e.value).startswith("memory_limit: not even batch 1 fits"), str(e.value)
    assert "--" not in str(e.value)


def test_verbose_prints_the_cli_console_and_a_python_reporter_sees_every_trial(capsys):
    from batchtune import _core
    from batchtune._trial import Runner, Subject

    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batchtune.tune(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                   memory_limit="32MiB", report=None, amp="off", max_batch=32, verbose=True,
                   time_budget=5)
    err = capsys.readouterr().err
    assert "searching the largest batch that fits" in err
    assert "timing" in err and "batch sizes" in err

    class Recorder(_core.TuneReporter):
        def __init__(self):
            super().__init__()
            self.events = []

        def phase_started(self, phase, what):
            self.events.append(("phase", phase))

        def trial_finished(self, phase, trial, index):
            self.events.append((phase, trial.batch_size, trial.fits))

        def finished(self, result):
            self.events.append(("finished", result.complete))

    recorder = Recorder()
    with batchtune.emulated_memory("32MiB") as memory:
        subject = Subject(model, optimizer, classify_loss, image_batch((3, 16, 16)),
                          torch.device("cpu"), "off")
        runner = Runner(subject, memory, 0.1)
        core = _core.tune(lambda amp: runner._cpp, memory,
                          _core.TuneOptions(amp="off", max_batch=32, time_budget_s=5),
                          reporter=recorder)
    searched = [e for e in recorder.events if e[0] == "search"]
    swept = [e for e in recorder.events if e[0] == "sweep"]
    assert len(searched) == len(core.search.trials)
    assert [e[1] for e in searched] == [t.batch_size for t in core.search.trials]
    assert swept and recorder.events[-1] == ("finished", True)
    assert ("phase", "search") in recorder.events and ("phase", "sweep") in recorder.events


def test_plan_make_reaches_the_target_exactly_and_warns_when_the_lr_cannot_be_scaled():
    plan = batchtune.Plan.make(64, target_batch=1000,
                               speeds=[(32, 900.0), (50, 990.0), (64, 1000.0)])
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (50, 20, 1000)
    assert any("not the 64 chosen" in r for r in plan.reasons), plan.reasons
    nearest = batchtune.Plan.make(64, target_batch=1009)
    assert nearest.global_batch_size == 1024
    assert any("cannot be reached exactly" in r for r in nearest.reasons), nearest.reasons
    assert batchtune.Plan.make(70, multiple_of=8).micro_batch_size == 64
    with pytest.raises(batchtune.Error, match="multiple_of"):
        batchtune.Plan.make(70, multiple_of=0)
    scaled = batchtune.Plan.make(256, optimizer="sgd", base_lr=0.1, base_batch=64)
    assert scaled.lr == pytest.approx(0.4)


def test_tune_without_base_batch_warns_that_the_lr_is_not_scaled():
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="lr not scaled"):
        r = batchtune.tune(model, optimizer, classify_loss, image_batch(), memory_limit="64MiB",
                           max_batch=64, sweep=False, report=None, amp="off", target_batch=128)
    assert r.plan.warnings and "base_batch" in r.plan.warnings[0], r.plan.warnings
    assert r.plan.lr == pytest.approx(0.1)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch(), memory_limit="64MiB",
                       max_batch=64, sweep=False, report=None, amp="off", target_batch=128,
                       base_batch=32)
    assert not r.plan.warnings
    assert r.plan.lr == pytest.approx(0.1 * r.plan.global_batch_size / 32)


def test_tune_writes_no_report_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch(), memory_limit="64MiB",
                       max_batch=16, amp="off", time_budget=5, base_batch=16)  # no report=
    assert r.report is None
    assert list(tmp_path.iterdir()) == []
