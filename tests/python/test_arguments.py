"""What a Python caller passes is checked before anything runs: a wrong type
is a `TypeError`, a wrong value a `batchtune.Error` (a `ValueError`), each one
line naming the argument and the fix, in the CLI's words where the CLI has
the flag; an output path that cannot be written fails before the first trial."""
import inspect
import json
import os

import pytest
import torch

import batchtune

from conftest import classify_loss, image_batch, small_convnet

LIMIT = "32MiB"


def _subject():
    model = small_convnet()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _one_line(error):
    text = str(error.value)
    assert "\n" not in text, text
    return text


class _Counted:
    """make_batch that counts its calls: a check made up front calls it never."""

    def __init__(self):
        self.calls = 0
        self.make = image_batch((3, 8, 8))

    def __call__(self, n):
        self.calls += 1
        return self.make(n)


def _tune_fails_first(match, error=ValueError, **kwargs):
    model, optimizer = _subject()
    make_batch = _Counted()
    arguments = dict(memory_limit=LIMIT, time_budget=30, max_batch=16, amp="off")
    arguments.update(kwargs)
    with pytest.raises(error) as e:
        batchtune.tune(model, optimizer, classify_loss, make_batch, **arguments)
    assert make_batch.calls == 0, "a trial ran before the check"
    text = _one_line(e)
    assert text.startswith(match), text
    return text


def _probe_fails(match, error=ValueError, **kwargs):
    model, optimizer = _subject()
    make_batch = _Counted()
    kwargs.setdefault("memory_limit", LIMIT)
    with pytest.raises(error) as e:
        batchtune.probe(model, optimizer, classify_loss, make_batch, **kwargs)
    assert make_batch.calls == 0
    text = _one_line(e)
    assert text.startswith(match), text
    return text


# -- memory_limit, as the CLI's --memory-limit reads it -----------------------

@pytest.mark.parametrize("limit", [2**63, 2**63 - 1, 2**64])
def test_a_memory_limit_past_the_cli_s_is_refused_with_its_words(limit):
    text = _probe_fails("memory_limit:", memory_limit=limit, batch_size=2, amp="off")
    assert f"cannot read '{limit}' as a size (too large)" in text
    assert "512MiB" in text  # the fix: a size the reader takes


def test_a_memory_limit_of_another_type_names_it():
    _probe_fails("memory_limit:", memory_limit=1.5e9, batch_size=2, amp="off")
    _probe_fails("memory_limit:", memory_limit=True, batch_size=2, amp="off")


# -- probe's counts -------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch_size=1.5), TypeError, "batch_size: must be a whole number (an int), got 1.5"),
    (dict(batch_size=True), TypeError, "batch_size: must be a whole number (an int), got True"),
    (dict(batch_size=0), batchtune.Error, "batch_size: must be at least 1, got 0"),
    (dict(steps=10**9), batchtune.Error, "steps: must be from 1 to 1000000, got 1000000000"),
    (dict(steps=0), batchtune.Error, "steps: must be from 1 to 1000000, got 0"),
    (dict(warmup_steps=-1), batchtune.Error, "warmup_steps: must be from 0 to 1000000, got -1"),
    (dict(min_time=7200), batchtune.Error, "min_time: must be from 0 to 3600 seconds"),
    (dict(margin=True), TypeError, "margin: must be a number"),
    (dict(amp="fp8"), batchtune.Error, "amp: 'fp8' is not one of auto, off, bf16, fp16"),
])
def test_probe_refuses_bad_counts_with_the_cli_s_bounds(kwargs, error, match):
    kwargs.setdefault("amp", "off")
    _probe_fails(match, error, **kwargs)


# -- tune's arguments -------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,match", [
    (dict(time_budget=True), TypeError, "time_budget: must be a number"),
    (dict(time_budget="60"), TypeError, "time_budget: must be a number"),
    (dict(time_budget=float("nan")), batchtune.Error, "time_budget: must be a finite number"),
    (dict(max_batch=64.0), TypeError, "max_batch: must be a whole number"),
    (dict(target_batch=True), TypeError, "target_batch: must be a whole number"),
    (dict(warmup_steps=-5), batchtune.Error, "warmup_steps: must be 0 or more steps, got -5"),
    (dict(base_batch=0), batchtune.Error, "base_batch: must be at least 1, got 0"),
    (dict(margin="0.1"), TypeError, "margin: must be a number"),
])
def test_tune_refuses_bad_arguments_before_a_trial(kwargs, error, match):
    _tune_fails_first(match, error, **kwargs)


@pytest.mark.parametrize("kwargs,option,match", [
    (dict(time_budget=0.5), "time_budget", "time_budget: must be at least 1 s, got 0.5"),
    (dict(search_tolerance=1.0), "search_tolerance", "search_tolerance: must be at least 0 and below 1"),
    (dict(margin=0.95), "margin", "margin: must be from 0 to"),
])
def test_a_library_error_carries_its_option_named_as_python_names_it(kwargs, option, match):
    text = _tune_fails_first(match, batchtune.Error, **kwargs)
    assert "--" not in text, text
    model, optimizer = _subject()
    arguments = dict(memory_limit=LIMIT, time_budget=30, max_batch=16, amp="off")
    arguments.update(kwargs)
    with pytest.raises(batchtune.Error) as e:
        batchtune.tune(model, optimizer, classify_loss, _Counted(), **arguments)
    assert e.value.option == option


def test_the_cores_option_errors_name_pythons_argument_never_the_flag():
    # The compiled layer raises the library's OptionError: what the CLI shows
    # as "--amp: ..." reaches Python as "amp: ...", the option attached.
    with pytest.raises(batchtune.Error) as e:
        batchtune._core.make_plan(8, amp="fp8")
    assert _one_line(e) == "amp: unknown mixed precision 'fp8'; use off, bf16, fp16 or auto"
    assert e.value.option == "amp"


@pytest.mark.parametrize("device,match", [
    ("gpu", "device: 'gpu' is not a device; use cpu, cuda or cuda:N"),
    ("", "device: '' is not a device; use cpu, cuda or cuda:N"),
    (3.5, "device: give 'cpu', 'cuda', 'cuda:N', a torch.device or None"),
])
def test_a_device_that_is_not_one_names_the_ones_there_are(device, match):
    error = TypeError if not isinstance(device, str) else batchtune.Error
    _tune_fails_first(match, error, device=device)
    _probe_fails(match, error, device=device, amp="off")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_without_a_cuda_device_says_so():
    _tune_fails_first("device: cuda asked for, but this machine has no usable CUDA device",
                      batchtune.Error, device="cuda")


# -- amp: fp16 is CUDA's, as the CLI says; one default for probe and tune -------------

def test_fp16_on_the_cpu_is_refused_by_probe_and_tune_as_by_the_cli():
    _probe_fails("amp: fp16 autocast is for CUDA devices; on the CPU use bf16 or off",
                 batchtune.Error, amp="fp16", batch_size=2, device="cpu")
    _tune_fails_first("amp: fp16 autocast is for CUDA devices; on the CPU use bf16 or off",
                      batchtune.Error, amp="fp16", device="cpu")


def test_probe_and_tune_default_to_amp_auto_and_probe_says_what_ran():
    assert inspect.signature(batchtune.probe).parameters["amp"].default == "auto"
    assert inspect.signature(batchtune.tune).parameters["amp"].default == "auto"
    model, optimizer = _subject()
    r = batchtune.probe(model, optimizer, classify_loss, image_batch((3, 8, 8)), batch_size=4,
                        memory_limit=LIMIT, steps=1, min_time=0, device="cpu")
    assert r.fits, r.error
    assert r.amp in ("off", "bf16")  # measured on the CPU: fp32 kept or bf16 faster
    assert r.amp_reason.startswith(f"amp {r.amp}:"), r.amp_reason
    assert "bf16" in r.amp_reason and "--" not in r.amp_reason
    asked = batchtune.probe(model, optimizer, classify_loss, image_batch((3, 8, 8)), batch_size=4,
                            memory_limit=LIMIT, steps=1, min_time=0, amp="off")
    assert (asked.amp, asked.amp_reason) == ("off", "amp off: as asked with amp")


# -- report: checked before the first trial -------------------------------------

def _unwritable_folder():
    """A folder where no file can be made even by root: /proc's top."""
    return "/proc"


@pytest.mark.parametrize("case", ["folder", "missing folder", "read-only", "/dev/full", "empty"])
def test_a_report_path_that_cannot_be_written_fails_before_the_tune(tmp_path, case):
    path = {"folder": str(tmp_path),
            "missing folder": str(tmp_path / "no" / "such" / "tune.html"),
            "read-only": os.path.join(_unwritable_folder(), "tune.html"),
            "/dev/full": "/dev/full",
            "empty": ""}[case]
    text = _tune_fails_first("report:", batchtune.Error, report=path)
    fix = {"folder": "is a folder; give a file path, like",
           "missing folder": "does not exist; create it first",
           "read-only": "cannot write in /proc",
           "/dev/full": "is not a regular file",
           "empty": "the path is empty"}[case]
    assert fix in text, text


def test_a_report_of_another_type_names_it():
    _tune_fails_first("report: give a file path", TypeError, report=True)


def test_the_lightning_callback_checks_its_report_when_made(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from batchtune.lightning import BatchTune

    with pytest.raises(batchtune.Error, match="^report: .* is a folder"):
        BatchTune(report=str(tmp_path))


# -- Plan.make and Plan.load ------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,match", [
    (dict(micro_batch_size=True), TypeError, "micro_batch_size: must be a whole number (an int), got True"),
    (dict(micro_batch_size=2.5), TypeError, "micro_batch_size: must be a whole number"),
    (dict(micro_batch_size=0), batchtune.Error, "micro_batch_size: must be at least 1, got 0"),
    (dict(warmup_steps=-5), batchtune.Error, "warmup_steps: must be 0 or more steps, got -5"),
    (dict(optimizer="lion"), batchtune.Error, "optimizer: 'lion' is not one of sgd, adam, adamw"),
    (dict(base_lr=0.0), batchtune.Error, "base_lr: must be positive and at most 1000, got 0"),
    (dict(workers=1000), batchtune.Error, "workers: must be 0 (load on the training thread) to 256"),
    (dict(prefetch=-1), batchtune.Error, "prefetch: must be 0 to 64 batches per worker, got -1"),
    (dict(amp="auto"), batchtune.Error, "amp: 'auto' is not one of off, bf16, fp16"),
    (dict(pin_memory="yes"), TypeError, "pin_memory: must be True or False"),
    (dict(target_batch=2**41), batchtune.Error, "target_batch: must be at most 1099511627776"),
])
def test_plan_make_refuses_bad_arguments(kwargs, error, match):
    kwargs.setdefault("micro_batch_size", 8)
    micro = kwargs.pop("micro_batch_size")
    with pytest.raises(error) as e:
        batchtune.Plan.make(micro, **kwargs)
    assert _one_line(e).startswith(match), str(e.value)


def _good_plan():
    return batchtune.Plan.make(8, target_batch=32)


@pytest.mark.parametrize("case", ["invalid", "utf-16", "latin-1", "deep", "folder", "missing"])
def test_plan_load_names_the_file_and_the_fix(tmp_path, case):
    path = tmp_path / "plan.json"
    text = _good_plan().to_json()
    if case == "invalid":
        path.write_text(text[:-5])
    elif case == "utf-16":
        path.write_bytes(text.encode("utf-16"))
    elif case == "latin-1":
        path.write_bytes(text.replace("micro", "m\xe9cro").encode("latin-1"))
    elif case == "deep":
        path.write_text("[" * 100000 + "]" * 100000)
    elif case == "folder":
        path.mkdir()
    with pytest.raises(batchtune.Error) as e:
        batchtune.Plan.load(str(path))
    message = _one_line(e)
    assert str(path) in message, message
    fix = {"invalid": "not valid JSON", "utf-16": "is UTF-16 text; save the plan as UTF-8",
           "latin-1": "is not UTF-8 text", "deep": "nested more than",
           "folder": "is not a regular file", "missing": "cannot read the plan"}[case]
    assert fix in message, message


def test_plan_load_reads_a_utf8_file_with_a_byte_order_mark_and_tune_json(tmp_path):
    plan = _good_plan()
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xef\xbb\xbf" + plan.to_json().encode())
    assert batchtune.Plan.load(str(path)) == plan
    path.write_text(json.dumps({"max_batch_size": 8, "plan": plan.to_dict()}))
    assert batchtune.Plan.load(path) == plan  # a PathLike too
