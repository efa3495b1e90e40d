"""tune on the CPU under an emulated budget: the maximum it returns fits, and
3 % above it does not; the rest of the pipeline (sweep, choice, plan, JSON,
HTML) from Python."""
import json
import math
import re
import threading

import pytest
import torch

import batchtune

from conftest import (TinyTransformer, assert_bit_identical, classify_loss, image_batch,
                      small_convnet, state_copy,
                      transformer_batch, transformer_loss)


def _max_fits_and_three_percent_above_does_not(model, optimizer, loss_fn, make_batch, limit):
    result = batchtune.tune(model, optimizer, loss_fn, make_batch, memory_limit=limit,
                            sweep=False, report=None, amp="off")
    assert result.complete
    best = result.max_batch_size
    assert best >= 4, result.trials
    at = batchtune.probe(model, optimizer, loss_fn, make_batch, batch_size=best,
                         memory_limit=limit, steps=1, min_time=0, amp="off")
    assert at.fits, at.error
    above = batchtune.probe(model, optimizer, loss_fn, make_batch,
                            batch_size=math.ceil(best * 1.03), memory_limit=limit, steps=1, min_time=0,
                            amp="off")
    assert not above.fits
    assert above.failure in ("out_of_memory", "over_budget")
    return result


def test_torchvision_resnet18_max_fits_and_3_percent_above_does_not():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # 11.2 M parameters: weights, momentum and grads take ~134 MiB; the rest is
    # activations at 3x32x32 and oneDNN's workspace, which depends on the CPU:
    # on an AVX2 AMD EPYC a step of 2 peaks at 143 MiB, past 160 MiB less the
    # margin, where the hosts before fitted at least 4. 224 MiB leaves room.
    r = _max_fits_and_three_percent_above_does_not(model, optimizer, classify_loss,
                                                   image_batch((3, 32, 32)), "224MiB")
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
        # The interval is the median's; the row's estimate, its fastest step, is at least that.
        low, high = row["samples_per_s_ci"]
        median_speed = 1e3 * row["batch_size"] / row["step_ms"]
        assert low * (1 - 1e-9) <= median_speed <= high * (1 + 1e-9)
        assert row["samples_per_s"] >= median_speed * (1 - 1e-9)
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
    # Each row's training FLOP/s: 3 x one sample's forward (PyTorch's own
    # counter) x samples/s; no MFU on the CPU, and the result says why.
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        classify_loss(model, image_batch((3, 16, 16))(1))
    forward = counter.get_total_flops()
    assert forward > 0
    for row in r.sweep:
        assert row.flops_per_s == pytest.approx(3 * forward * row.samples_per_s, rel=1e-9)
        assert row.mfu is None
    assert d["peak_flops"] is None
    assert d["mfu_note"] == "no peak for the CPU: model FLOPs utilization is given for GPUs"


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


# -- round three: what a hostile tester and a new user found ------------------

def _quick_tune(model, optimizer, make_batch, **kwargs):
    arguments = dict(memory_limit="32MiB", sweep=False, amp="off", max_batch=64, time_budget=30)
    arguments.update(kwargs)
    return batchtune.tune(model, optimizer, classify_loss, make_batch, **arguments)


@pytest.mark.parametrize("case", ["half of n", "ignores n", "one tensor short"])
def test_a_make_batch_of_another_size_than_asked_is_refused_naming_it(case):
    """A maximum is only true of the batch that ran: make_batch(n) must give n
    samples in every tensor; one that gives n//2, a constant size, or one
    tensor short is refused at the first trial, naming what it returned, and
    leaves no trace."""
    make = image_batch((3, 8, 8))

    def make_batch(n):
        x, y = make(n)
        if case == "half of n":
            return x[: max(1, n // 2)], y[: max(1, n // 2)]
        if case == "ignores n":
            return make(8)
        return x, y[:-1]

    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = state_copy(model, optimizer)
    with pytest.raises(batchtune.Error) as e:
        _quick_tune(model, optimizer, make_batch)
    message = str(e.value)
    assert re.fullmatch(r"make_batch: make_batch\((\d+)\) returned (\d+) samples in batch\[(0|1)\] "
                        r"\(its first dimension\); it must return exactly n samples in every tensor",
                        message), message
    n, returned = map(int, re.match(r"make_batch: make_batch\((\d+)\) returned (\d+)", message).groups())
    assert n != returned
    assert_bit_identical(before, state_copy(model, optimizer))
    with pytest.raises(batchtune.Error, match=r"^make_batch: make_batch\(\d+\) returned"):
        batchtune.probe(model, optimizer, classify_loss, make_batch, batch_size=16,
                        memory_limit="32MiB", amp="off", steps=1, min_time=0)


def test_a_dict_batch_may_carry_a_0_dim_tensor_first():
    make = image_batch((3, 8, 8))

    def make_batch(n):
        x, y = make(n)
        return {"temperature": torch.tensor(2.0), "x": x, "y": y}

    def loss_fn(model, batch):
        return torch.nn.functional.cross_entropy(model(batch["x"]) / batch["temperature"], batch["y"])

    model = small_convnet()
    r = batchtune.tune(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, make_batch,
                       memory_limit="32MiB", sweep=False, amp="off", max_batch=16, time_budget=30)
    assert r.max_batch_size == 16


def test_a_second_tune_while_one_runs_in_another_thread_is_refused():
    """The emulated budget and the random generators are the process's: a
    tune or probe from a second thread while one runs is refused with a
    RuntimeError naming the cause, and the first one finishes as if alone."""
    started, release = threading.Event(), threading.Event()
    make = image_batch((3, 8, 8))

    def slow_make_batch(n):
        started.set()
        release.wait(timeout=120)  # the main thread sets it; the timeout only guards a hang
        return make(n)

    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    results = {}

    def first():
        try:
            results["first"] = batchtune.probe(model, optimizer, classify_loss, slow_make_batch,
                                               batch_size=4, memory_limit="32MiB", amp="off",
                                               steps=1, min_time=0)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            results["first"] = e

    thread = threading.Thread(target=first, name="first-tuner")
    thread.start()
    try:
        assert started.wait(timeout=120)
        other = small_convnet()
        other_optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
        with pytest.raises(RuntimeError) as e:
            _quick_tune(other, other_optimizer, make)
        message = str(e.value)
        assert message.startswith("batchtune.tune: another tune or probe is running in this "
                                  "process (thread 'first-tuner')"), message
        assert "one after the other" in message and "\n" not in message
        with pytest.raises(RuntimeError, match=r"^batchtune.probe: another tune or probe"):
            batchtune.probe(other, other_optimizer, classify_loss, make, batch_size=2,
                            memory_limit="32MiB", amp="off")
    finally:
        release.set()
        thread.join()
    assert isinstance(results["first"], batchtune.ProbeResult), results["first"]
    assert results["first"].fits
    # Once it ended, the next one runs.
    assert _quick_tune(other, other_optimizer, make, max_batch=8).max_batch_size == 8


def test_no_memory_limit_inside_emulated_memory_is_the_block_s_budget():
    """`tune(memory_limit=None)` in `emulated_memory("2MiB")` measures against
    2 MiB (not half the RAM), and the block's budget is back afterwards."""
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    make = image_batch((3, 16, 16))
    with batchtune.emulated_memory("2MiB"):
        r = batchtune.tune(model, optimizer, classify_loss, make, sweep=False, amp="off",
                           max_batch=4096, time_budget=60)
        p = batchtune.probe(model, optimizer, classify_loss, make, batch_size=4096, amp="off",
                            steps=1, min_time=0)
        from batchtune import _core
        assert _core.budget_get() == 2 << 20
    assert {t.capacity_bytes for t in r.trials} == {2 << 20}
    assert 1 <= r.max_batch_size < 4096  # memory bound it, not the cap
    assert p.capacity_bytes == 2 << 20 and not p.fits


_CLI_FLAG = re.compile(r"(?<![\w-])--[a-z]")


def test_reasons_speak_python_and_say_where_unasked_values_came_from(capsys):
    """Every text of a Python tune — the verbose console, the choice, the
    diagnosis, the plan's reasons and warnings, the JSON — names Python
    arguments (target_batch, not --target-batch), says the lr is the
    optimizer's when no base_lr was given, and the console's precision line
    is the plan's."""
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="base_batch"):
        r = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 8, 8)),
                           memory_limit="32MiB", amp="off", max_batch=16, target_batch=64,
                           time_budget=20, verbose=True)
    err = capsys.readouterr().err
    assert "target_batch 64 reached" in err
    texts = [err, r.reason, r.diagnosis, r.to_json()] + r.plan.reasons + r.plan.warnings
    for text in texts:
        assert not _CLI_FLAG.search(text), _CLI_FLAG.search(text).string[:300]
    lr_reason = next(x for x in r.plan.reasons if x.startswith("lr "))
    assert "(the optimizer's lr)" in lr_reason and "base_lr" not in lr_reason, lr_reason
    amp_reason = next(x for x in r.plan.reasons if x.startswith("amp "))
    assert amp_reason == "amp off: as asked with amp"
    assert f"  - {amp_reason}" in err.splitlines()
    assert r.to_dict()["amp_reason"] == amp_reason
    # amp auto on the CPU: the console's measured precision line is the plan's.
    auto = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 8, 8)),
                          memory_limit="32MiB", max_batch=16, sweep=False, base_lr=0.1,
                          base_batch=16, time_budget=20, verbose=True)
    err = capsys.readouterr().err
    amp_reason = next(x for x in auto.plan.reasons if x.startswith("amp "))
    assert "bf16" in amp_reason and not _CLI_FLAG.search(amp_reason), amp_reason
    assert amp_reason in err.splitlines(), err
    given = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 8, 8)),
                           memory_limit="32MiB", amp="off", max_batch=16, sweep=False,
                           base_lr=0.1, base_batch=16, target_batch=64, time_budget=20)
    assert any("(base_lr)" in x for x in given.plan.reasons), given.plan.reasons


def test_tune_plans_for_the_world_size_it_is_given():
    """One process planning for a job of two (as the Lightning callback does
    for its ranks): the plan's global batch counts both."""
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 8, 8)),
                       memory_limit="32MiB", amp="off", max_batch=16, sweep=False, base_lr=0.1,
                       base_batch=16, target_batch=64, world_size=2, time_budget=20)
    plan = r.plan
    assert plan.world_size == 2
    assert plan.global_batch_size == plan.micro_batch_size * plan.accumulation_steps * 2 == 64
    assert any("target_batch 64" in x and "on each of 2 processes" in x for x in plan.reasons), \
        plan.reasons


def test_the_sweep_times_the_divisors_a_target_batch_needs():
    """target_batch 30 over a largest batch of 7: 6, 5 and 3, which reach 30
    exactly and are not on the powers-of-two grid (1, 2, 4, 7), are timed
    too, so the plan decides by their measured speed, not by sizes never
    timed (the integrations' 5 x 6 = 30 for a target of 32)."""
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    r = batchtune.tune(model, optimizer, classify_loss, image_batch((3, 8, 8)),
                       memory_limit="32MiB", amp="off", max_batch=7, base_lr=0.1, base_batch=30,
                       target_batch=30, time_budget=20)
    timed = {row.batch_size for row in r.sweep}
    assert {7, 6, 5, 3} <= timed, timed
    plan = r.plan
    if plan.global_batch_size == 30:
        assert plan.micro_batch_size * plan.accumulation_steps == 30
    else:  # the divisors measured slower than the tolerance allows: the reason says so
        assert any("no micro-batch within the speed tolerance" in x for x in plan.reasons), \
            plan.reasons
