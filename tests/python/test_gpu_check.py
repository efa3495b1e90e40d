"""scripts/gpu_check.py and its package scripts/gpucheck/, the rows of scripts/gpu-check, on made-up outputs:
strict (a skipped row fails the run), each row's figures in summary.json, the
guide's claims judged on the GPU and only parsed in the rehearsal, every
command bounded."""
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check
spec.loader.exec_module(gpu_check)  # puts scripts/ on sys.path for its package

from gpucheck import checks, rows, running, verdicts  # noqa: E402

Outcome, Row = running.Outcome, rows.Row


def outcome(doc, rc=0, err=""):
    return Outcome(rc, json.dumps(doc), err, 1.0)


def sweep_row(batch, samples_per_s, utilization, energy=1.0, mfu=0.3):
    return {"batch_size": batch, "samples_per_s": samples_per_s, "utilization": utilization,
            "energy_j_per_sample": energy, "peak_bytes": batch << 20, "mfu": mfu}


def tune_doc(chosen=256, rows=None):
    rows = rows or [sweep_row(16, 1000, 40), sweep_row(128, 2600, 80), sweep_row(256, 2900, 91)]
    return {"chosen_batch_size": chosen, "max_batch_size": 512, "amp": "bf16", "complete": True,
            "sweep": rows, "utilization_note": "nvml"}


def test_a_skipped_row_fails_the_run_and_summary_json_has_every_row(tmp_path):
    summary = rows.Summary(tmp_path)
    summary.add(Row("env", "pass", "ok", {"device_count": 1}, 2.0), mode="gpu")
    assert json.loads((tmp_path / "summary.json").read_text())["passed"] is True
    summary.add(Row("claim-utilization", "skip", "deadline: 5 s left"))
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["passed"] is False
    assert [r["name"] for r in doc["rows"]] == ["env", "claim-utilization"]
    assert set(doc["rows"][0]) == {"name", "status", "detail", "figures", "seconds"}
    assert doc["rows"][0]["figures"] == {"device_count": 1}
    assert "SKIP  claim-utilization" in (tmp_path / "summary.txt").read_text()
    assert gpu_check.main(["finish", "--out", str(tmp_path)]) == 1
    assert not rows.passed([])  # no row is no pass


def test_rows_from_the_shell_and_finish_exit_zero_only_when_all_passed(tmp_path, capsys):
    assert gpu_check.main(["row", "--out", str(tmp_path), "--mode", "gpu", "pass", "build", "12", "built"]) == 0
    assert gpu_check.main(["finish", "--out", str(tmp_path)]) == 0
    gpu_check.main(["row", "--out", str(tmp_path), "fail", "tests-cuda", "3", "exit 1\nFAILED"])
    assert gpu_check.main(["finish", "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["rows"][1]["detail"] == "exit 1 FAILED"


def test_a_check_without_time_left_is_a_skip_row_and_runs_nothing(tmp_path):
    args = type("Args", (), dict(out=str(tmp_path), work=str(tmp_path / "w"), cli="/nonexistent/batchtune",
                                 mode="gpu", deadline_at=time.time() + 5, python=sys.executable,
                                 smi="nvidia-smi"))
    run = checks.Checks(args)
    assert run.check("probe-fits", 90, verdicts.verdict_fits, ["probe"]) is None
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["rows"][0]["status"] == "skip" and "deadline" in doc["rows"][0]["detail"]
    assert doc["passed"] is False


def test_every_command_is_bounded():
    # Left alone, the command would print after 30 s: that it never did shows
    # it was ended at its limit (how long that took is not asserted).
    o = running.run_bounded([sys.executable, "-c", "import time; time.sleep(30); print('finished')"], 1)
    assert o.timed_out and o.rc == 124 and "finished" not in o.out
    status, detail, _ = verdicts.verdict_fits(o)
    assert status == "fail" and "timed out" in detail
    assert running.run_bounded([sys.executable, "-c", "print(1)"], 0).rc == 124  # no time: not started


def test_utilization_claim_reads_the_chosen_rows_timed_window():
    status, detail, figures = verdicts.verdict_claim_utilization(outcome(tune_doc()), True)
    assert status == "pass" and figures["utilization"] == 91 and figures["target"] == 85
    low = tune_doc(rows=[sweep_row(16, 1000, 40), sweep_row(256, 2900, 70)])
    assert verdicts.verdict_claim_utilization(outcome(low), True)[0] == "fail"
    assert verdicts.verdict_claim_utilization(outcome(low), False)[0] == "pass"  # rehearsal: parsed
    none = tune_doc(rows=[sweep_row(256, 2900, None)])
    assert verdicts.verdict_claim_utilization(outcome(none), False)[0] == "fail"  # no figure: fail anywhere
    assert verdicts.verdict_claim_utilization(Outcome(0, "not json", "", 1.0), True)[0] == "fail"


def test_throughput_claim_is_the_chosen_batch_against_batch_16():
    base = {"batch_size": 16, "fits": True, "samples_per_s": 1000.0}
    status, _, figures = verdicts.verdict_claim_throughput(tune_doc(), base, True)
    assert status == "pass" and figures["gain"] == pytest.approx(2.9)
    flat = tune_doc(rows=[sweep_row(16, 1000, 90), sweep_row(256, 1500, 95)])
    assert verdicts.verdict_claim_throughput(flat, base, True)[0] == "fail"
    assert verdicts.verdict_claim_throughput(flat, base, False)[0] == "pass"
    assert verdicts.verdict_claim_throughput(tune_doc(), dict(base, fits=False), False)[0] == "fail"


def test_bf16_batch_claim_is_the_ratio_of_the_largest_batches():
    status, detail, figures = verdicts.verdict_claim_bf16_batch("resnet", {"max_batch_size": 900},
                                                                  {"max_batch_size": 1700}, True)
    assert status == "pass" and figures["ratio"] == pytest.approx(1700 / 900)
    assert verdicts.verdict_claim_bf16_batch("gpt", {"max_batch_size": 40}, {"max_batch_size": 44}, True)[0] == "fail"
    assert verdicts.verdict_claim_bf16_batch("gpt", {"max_batch_size": 0}, {"max_batch_size": 44}, False)[0] == "fail"


def test_tune_memory_is_judged_by_nvidia_smi_not_by_the_runs_own_peak():
    doc = tune_doc()
    limit = 6 << 30
    ok = verdicts.verdict_tune_memory(outcome(doc), limit, [500, 4000, 6000], 400.0, True)
    assert ok[0] == "pass" and ok[2]["smi_max_used_bytes"] == (6000 - 400) * 2**20
    over = verdicts.verdict_tune_memory(outcome(doc), limit, [500, 7000], 400.0, True)
    assert over[0] == "fail"
    assert verdicts.verdict_tune_memory(outcome(doc), limit, [], None, True)[0] == "fail"
    no_energy = tune_doc(rows=[sweep_row(16, 1000, 40, energy=None)])
    assert verdicts.verdict_tune_memory(outcome(no_energy), limit, [500], 400.0, True)[0] == "fail"
    assert verdicts.verdict_tune_memory(outcome(no_energy), limit, [500], 400.0, False)[0] == "pass"
    # Model FLOPs utilization in every row on a GPU of the table (the CPU has none).
    assert ok[2]["mfu"] == pytest.approx(0.3)
    no_mfu = tune_doc(rows=[sweep_row(16, 1000, 40, mfu=None)])
    assert verdicts.verdict_tune_memory(outcome(no_mfu), limit, [500], 400.0, True)[0] == "fail"
    assert verdicts.verdict_tune_memory(outcome(no_mfu), limit, [500], 400.0, False)[0] == "pass"


def test_monitor_against_nvidia_smi():
    head = json.dumps({"sampler": "nvml"})
    lines = [head] + [json.dumps({"device": "cuda:0", "utilization_percent": 90, "memory_used_bytes": 10 << 30})
                      for _ in range(5)]
    smi = "\n".join(["88, 10300"] * 5)
    assert verdicts.verdict_monitor_vs_smi(lines, smi, "cuda:0", True)[0] == "pass"
    far = "\n".join(["40, 10300"] * 5)
    assert verdicts.verdict_monitor_vs_smi(lines, far, "cuda:0", True)[0] == "fail"
    assert verdicts.verdict_monitor_vs_smi(lines[:2], smi, "cuda:0", True)[0] == "fail"


def test_the_fake_nvidia_smi_answers_as_the_real_one_formats():
    smi = running.Smi([sys.executable, str(ROOT / "tests" / "fake_nvidia_smi.py")])
    assert smi.memory_used_mib() == 100.0
    assert smi.gpu_count() == 0
    assert smi.call("--query-compute-apps=pid,used_memory", "--format=csv,noheader").rc == 0


def test_clean_error_wants_exit_2_and_one_line():
    # The text the H200 run printed for a device past the last one.
    missing = "batchtune: --device: cuda:1: there are only 1 CUDA device(s), numbered from 0\n"
    assert verdicts.verdict_clean_error(Outcome(2, "", missing, 0.1), "--device: cuda:1")[0] == "pass"
    assert verdicts.verdict_clean_error(Outcome(2, "", missing, 0.1), "--device: cuda:2")[0] == "fail"
    assert verdicts.verdict_clean_error(Outcome(2, "", "a\nb\n", 0.1), "a")[0] == "fail"
    assert verdicts.verdict_clean_error(Outcome(1, "", "--device x\n", 0.1), "--device")[0] == "fail"


# ---------------------------------------------------------------- the Python rows, on made-up job outputs


def job(doc, rc=0, noise="Lightning printed this first\n"):
    """A python_jobs.py job's stdout: whatever the libraries printed, then its figures."""
    return Outcome(rc, noise + json.dumps(doc) + "\n", "", 1.0)


def tune_job(**kw):
    doc = {"max_batch_size": 118, "complete": True, "reason": "the largest batch that fits (no sweep)",
           "seconds": 20.0, "model": "resnet50 3x224x224", "amp": "bf16", "memory_limit": "3GiB",
           "state_tensors": 800, "state_identical": True, "rng_identical": True,
           "allocator_before": {"fraction": 1.0, "current_device": 0},
           "allocator_after": {"fraction": 1.0, "current_device": 0}}
    return dict(doc, **kw)


def test_py_tune_wants_no_trace_and_the_allocator_as_found():
    status, detail, figures = verdicts.verdict_py_tune(job(tune_job()), True)
    assert status == "pass" and figures["max_batch_size"] == 118, detail
    assert verdicts.verdict_py_tune(job(tune_job(state_identical=False)), True)[0] == "fail"
    assert verdicts.verdict_py_tune(job(tune_job(rng_identical=False)), True)[0] == "fail"
    capped = tune_job(allocator_after={"fraction": 0.05, "current_device": 0})  # the tune's cap left behind
    assert verdicts.verdict_py_tune(job(capped), True)[0] == "fail"
    moved = tune_job(allocator_after={"fraction": 1.0, "current_device": 1})
    assert verdicts.verdict_py_tune(job(moved), True)[0] == "fail"
    cpu = tune_job(allocator_before={"fraction": None, "current_device": None},
                   allocator_after={"fraction": None, "current_device": None})
    assert verdicts.verdict_py_tune(job(cpu), False)[0] == "pass"
    assert verdicts.verdict_py_tune(job(cpu), True)[0] == "fail"  # a GPU run must read them
    assert verdicts.verdict_py_tune(job(tune_job(max_batch_size=0)), True)[0] == "fail"
    assert verdicts.verdict_py_tune(job(tune_job(), rc=1), True)[0] == "fail"
    assert verdicts.verdict_py_tune(Outcome(1, "", "Traceback ...", 1.0), True)[0] == "fail"


def test_py_tune_probes_a_clearly_larger_batch_in_a_fresh_process():
    assert verdicts.clearly_larger(118) == 148  # a quarter above: more than the 5 % reserve
    assert verdicts.clearly_larger(4) == 5
    fits = {"batch_size": 118, "fits": True, "failure": None, "peak_bytes": 3 << 30, "error": ""}
    oom = {"batch_size": 148, "fits": False, "failure": "out_of_memory", "peak_bytes": 3 << 30,
           "error": "CUDA out of memory"}
    assert verdicts.verdict_py_probe(job(fits), True)[0] == "pass"
    assert verdicts.verdict_py_probe(job(oom), True)[0] == "fail"
    assert verdicts.verdict_py_probe(job(oom), False)[0] == "pass"
    assert verdicts.verdict_py_probe(job(dict(oom, failure="over_budget")), False)[0] == "pass"
    assert verdicts.verdict_py_probe(job(fits), False)[0] == "fail"  # the search was over-cautious
    other = dict(oom, failure="error", error="RuntimeError: shape")
    assert verdicts.verdict_py_probe(job(other), False)[0] == "fail"  # not any failure


def trainer_run(amp, steps=10, scale=None, skipped=0, micro=64, now=64, recoveries=(), forced=None):
    run = {"amp": amp, "steps": steps, "losses": [2.0] * steps, "finite": True, "parameters_moved": True,
           "global_batch_size": micro * (1 if forced is not None else 2), "micro_batch_size": now,
           "plan_micro_batch_size": micro, "recoveries": list(recoveries), "loss_scale": scale,
           "skipped_steps": skipped}
    if forced is not None:
        run["forced"] = forced
    return run


def trainer_job(**kw):
    doc = {"bf16": trainer_run("bf16"), "fp16": trainer_run("fp16", scale=65536.0),
           "oom": trainer_run("bf16", steps=3, now=32, recoveries=["step 1: out of memory ..."], forced=1)}
    return dict(doc, **kw)


def test_py_trainer_wants_fp16_steps_taken_and_the_forced_oom_recovered():
    status, detail, figures = verdicts.verdict_py_trainer(job(trainer_job()), True)
    assert status == "pass", detail
    assert figures["oom_micro_batch"] == [64, 32] and figures["oom_global_batch"] == 64
    skipping = trainer_job(fp16=trainer_run("fp16", scale=1.0, skipped=5))
    assert verdicts.verdict_py_trainer(job(skipping), True)[0] == "fail"
    no_fp16 = trainer_job()
    del no_fp16["fp16"]
    assert verdicts.verdict_py_trainer(job(no_fp16), True)[0] == "fail"   # a GPU runs fp16
    assert verdicts.verdict_py_trainer(job(no_fp16), False)[0] == "pass"  # the CPU cannot
    never = trainer_job(oom=trainer_run("bf16", steps=3, now=64, forced=0))
    assert verdicts.verdict_py_trainer(job(never), True)[0] == "fail"  # no out-of-memory seen
    lost = trainer_job(oom=dict(trainer_run("bf16", steps=3, now=32, recoveries=["x"], forced=1),
                                global_batch_size=32))
    assert verdicts.verdict_py_trainer(job(lost), True)[0] == "fail"  # the global batch was not kept
    nan = trainer_job(bf16=dict(trainer_run("bf16"), finite=False))
    assert verdicts.verdict_py_trainer(job(nan), True)[0] == "fail"


def fit(precision="bf16-mixed", fused=False, noise=None, steps=10, micro=64):
    return {"precision": precision, "fused": fused, "global_step": steps, "max_steps": 10, "seconds": 5.0,
            "micro_batch_size": micro, "global_batch_size": micro and micro * 4, "max_batch_size": micro,
            "final_loss": 1.5, "finite": True, "noise_scale": noise, "schedule": [{"step": 0}]}


def test_lightning_wants_the_plan_applied_and_every_step():
    assert verdicts.verdict_lightning(job(fit()))[0] == "pass"
    assert verdicts.verdict_lightning(job(fit(micro=None)))[0] == "fail"  # the callback never tuned
    assert verdicts.verdict_lightning(job(fit(steps=7)))[0] == "fail"


def test_lightning_adapt_fp16_wants_a_noise_scale_near_the_unscaled_one():
    good = {"fused": fit("16-mixed", True, noise=300.0), "reference": fit(noise=120.0)}
    status, detail, figures = verdicts.verdict_lightning_adapt(job(good), True)
    assert status == "pass" and figures["ratio"] == pytest.approx(2.5), detail
    scaled = dict(good, fused=fit("16-mixed", True, noise=120.0 * 65536.0 ** 2))  # still scaled: off by scale^2
    assert verdicts.verdict_lightning_adapt(job(scaled), True)[0] == "fail"
    negative = dict(good, fused=fit("16-mixed", True, noise=-5.0))
    assert verdicts.verdict_lightning_adapt(job(negative), True)[0] == "fail"
    missing = dict(good, fused=fit("16-mixed", True, noise=None))
    assert verdicts.verdict_lightning_adapt(job(missing), True)[0] == "fail"
    bf16 = dict(good, fused=fit("bf16-mixed", True, noise=300.0))
    assert verdicts.verdict_lightning_adapt(job(bf16), True)[0] == "fail"   # a GPU runs 16-mixed
    assert verdicts.verdict_lightning_adapt(job(bf16), False)[0] == "pass"  # the CPU cannot
    unfused = dict(good, fused=fit("16-mixed", False, noise=300.0))
    assert verdicts.verdict_lightning_adapt(job(unfused), True)[0] == "fail"


def test_hf_wants_the_global_batch_kept_and_its_20_steps():
    doc = {"max_batch_size": 24, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 4,
           "bf16": True, "fp16": False, "global_batch_size": 64, "global_step": 20, "training_loss": 6.1,
           "tune_seconds": 12.0, "max_steps": 20}
    assert verdicts.verdict_hf(job(doc))[0] == "pass"
    assert verdicts.verdict_hf(job(dict(doc, global_step=12)))[0] == "fail"
    assert verdicts.verdict_hf(job(dict(doc, global_batch_size=32)))[0] == "fail"
    assert verdicts.verdict_hf(job(dict(doc, training_loss=float("nan"))))[0] == "fail"


def test_the_python_part_runs_only_the_python_rows(tmp_path, monkeypatch):
    args = type("Args", (), dict(out=str(tmp_path), work=str(tmp_path / "w"), cli="/nonexistent/batchtune",
                                 mode="rehearse", deadline_at=time.time() + 600, python=sys.executable,
                                 smi="nvidia-smi"))
    run = checks.Checks(args)
    seen = []
    monkeypatch.setattr(run, "basic", lambda: seen.append("basic"))
    monkeypatch.setattr(run, "claims", lambda: seen.append("claims"))
    monkeypatch.setattr(run, "python_rows", lambda: seen.append("python"))
    run.run("python")
    assert seen == ["python"]
    run.run("all")
    assert seen == ["python", "basic", "claims", "python"]


def test_a_failed_tune_job_skips_its_probes(tmp_path, monkeypatch):
    args = type("Args", (), dict(out=str(tmp_path), work=str(tmp_path / "w"), cli="/nonexistent/batchtune",
                                 mode="rehearse", deadline_at=time.time() + 600, python=sys.executable,
                                 smi="nvidia-smi"))
    run = checks.Checks(args)
    monkeypatch.setattr(run, "job_run", lambda name, limit, *a: Outcome(1, "", "ImportError: batchtune", 0.5))
    run.py_tune()
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["status"]) for r in doc["rows"]] == [
        ("py-tune", "fail"), ("py-tune-largest", "skip"), ("py-tune-larger", "skip")]
    assert doc["passed"] is False


def test_gpu_check_refuses_a_part_it_does_not_have():
    import subprocess
    o = subprocess.run([str(ROOT / "scripts" / "gpu-check"), "--part", "3"], capture_output=True, text=True,
                       timeout=30)
    assert o.returncode == 2 and "--part needs 1 or 2" in o.stderr


# ---------------------------------------------------------------- the paths later issues added, on made-up outputs


def schedule(*changes, start=64):
    """A batch_schedule as the CLI writes it: the start, then (step, batch) changes."""
    entries = [{"step": 0, "global_batch_size": start, "micro_batch_size": start, "accumulation_steps": 1,
                "lr": 1e-3, "noise_scale": None, "reason": "the plan's global batch"}]
    for step, batch in changes:
        entries.append({"step": step, "global_batch_size": batch, "micro_batch_size": batch,
                        "accumulation_steps": 1, "lr": 1e-3, "noise_scale": 250.0,
                        "reason": f"global batch {batch}: more goodput"})
    return entries


def adapt_summary(**kw):
    doc = {"steps": 60, "complete": True, "final_loss": 2.1, "noise_scale": 310.0, "noise_scale_note": None,
           "samples_per_s": 5000.0, "oom_recoveries": 0, "batch_schedule": schedule((20, 128))}
    return dict(doc, **kw)


def with_log(doc, changes):
    """The CLI's outcome with --json -: the JSON on stdout, the log on stderr."""
    log = "".join(f"adapt: global batch 64 -> 128 (128 x 1 per rank), lr 0.001 over 20 steps: ...\n"
                  for _ in range(changes))
    return Outcome(0, json.dumps(doc), "plan: ...\n" + log, 1.0)


def test_train_adapt_wants_the_schedule_as_the_cli_writes_it_and_a_noise_scale():
    status, detail, figures = verdicts.verdict_train_adapt(with_log(adapt_summary(), 1), 64, 60, True)
    assert status == "pass" and figures["changes"] == 1 and figures["noise_scale"] == 310.0, detail
    # No change at all is a decision too, where the noise scale was measured.
    kept = adapt_summary(batch_schedule=schedule())
    assert verdicts.verdict_train_adapt(with_log(kept, 0), 64, 60, True)[0] == "pass"
    assert verdicts.verdict_train_adapt(with_log(adapt_summary(), 0), 64, 60, True)[0] == "fail"  # a change unlogged
    unmeasured = adapt_summary(noise_scale=None, noise_scale_note="not positive")
    assert verdicts.verdict_train_adapt(with_log(unmeasured, 1), 64, 60, True)[0] == "fail"
    missing = adapt_summary()
    del missing["batch_schedule"]
    assert verdicts.verdict_train_adapt(with_log(missing, 0), 64, 60, True)[0] == "fail"
    no_reason = adapt_summary(batch_schedule=schedule((20, 128)))
    no_reason["batch_schedule"][1]["noise_scale"] = None
    assert verdicts.verdict_train_adapt(with_log(no_reason, 1), 64, 60, True)[0] == "fail"
    lacking = adapt_summary()
    del lacking["batch_schedule"][0]["lr"]
    assert "lack lr" in verdicts.verdict_train_adapt(with_log(lacking, 1), 64, 60, True)[1]
    assert verdicts.verdict_train_adapt(with_log(adapt_summary(steps=40), 1), 64, 60, True)[0] == "fail"
    nan = adapt_summary(final_loss=float("nan"))
    assert verdicts.verdict_train_adapt(with_log(nan, 1), 64, 60, True)[0] == "fail"
    elsewhere = adapt_summary(batch_schedule=schedule((20, 128), start=32))
    assert verdicts.verdict_train_adapt(with_log(elsewhere, 1), 64, 60, True)[0] == "fail"  # not from --batch-size


def text_run(steps, resumed_from=None, changes=((5, 512),), **kw):
    doc = {"steps": steps, "complete": True, "final_loss": 3.2, "tokens_per_s": 90000.0, "token_budget": 4096,
           "target_tokens": 256, "oom_recoveries": 0,
           "batch_schedule": schedule(*[c for c in changes if c[0] < steps], start=256)}
    for e in doc["batch_schedule"]:  # a token step: the micro-batch is a budget in padded tokens
        e["micro_batch_size"], e["accumulation_steps"] = 4096, 1
    if resumed_from is not None:
        doc["resumed_from_step"] = resumed_from
    return dict(doc, **kw)


def resumed_outcome(doc, line="resumed from /tmp/ckpt/checkpoint.pt at step 10 (epoch 1, micro-batch 20 of it)"):
    return Outcome(0, json.dumps(doc), f"plan: from the checkpoint in /tmp/ckpt\n{line}\n", 1.0)


def test_train_text_wants_the_resume_to_go_on_from_the_checkpoints_step():
    first = outcome(text_run(10))
    resumed = resumed_outcome(text_run(20, resumed_from=10, changes=((5, 512), (15, 1024))))
    status, detail, figures = verdicts.verdict_train_text(first, resumed, 10, 20, 256, True)
    assert status == "pass" and figures["resumed_from_step"] == 10, detail
    afresh = resumed_outcome(text_run(20, changes=((5, 512), (15, 1024))), line="")  # started again
    assert "went on from step None" in verdicts.verdict_train_text(first, afresh, 10, 20, 256, True)[1]
    finished = resumed_outcome(text_run(10, resumed_from=10, already_finished=True))
    assert verdicts.verdict_train_text(first, finished, 10, 20, 256, True)[0] == "fail"
    other = resumed_outcome(text_run(20, resumed_from=10, changes=((5, 1024),)))  # not the schedule it had
    assert "does not continue" in verdicts.verdict_train_text(first, other, 10, 20, 256, True)[1]
    assert verdicts.verdict_train_text(first, resumed, 10, 20, 256, False)[0] == "fail"  # no checkpoint written
    elsewhere = resumed_outcome(text_run(20, resumed_from=10, changes=((5, 512), (15, 1024))),
                                line="resumed from /tmp/ckpt/checkpoint.pt at step 5 (epoch 1, ...)")
    assert "about where it went on from" in verdicts.verdict_train_text(first, elsewhere, 10, 20, 256, True)[1]
    refused = Outcome(2, "", "batchtune: --resume: ... was written by a run with ...\n", 1.0)
    assert verdicts.verdict_train_text(first, refused, 10, 20, 256, True)[0] == "fail"


def probe_doc(batch, fits=True, failure=None, peak=1 << 30):
    return {"batch_size": batch, "fits": fits, "failure": failure, "peak_bytes": peak, "usable_bytes": 3 << 30,
            "step_ms": 40.0, "samples_per_s": batch * 25.0, "error": None if fits else "CUDA out of memory"}


def search_doc(n):
    return {"max_batch_size": n, "complete": True, "amp": "bf16", "usable_bytes": 3 << 30,
            "search": {"trials": 12, "seconds": 9.0, "stop_reason": "bracket closed"}}


def test_expandable_segments_wants_the_boundary_to_hold_under_them():
    search = outcome(search_doc(120))
    largest, larger = outcome(probe_doc(120)), outcome(probe_doc(150, False, "out_of_memory"))
    status, detail, figures = verdicts.verdict_expandable(search, largest, larger, True, 118)
    assert status == "pass" and figures["larger_batch"] == 150 and "found 118" in detail, detail
    assert "ignores" not in detail
    assert "ignores" in verdicts.verdict_expandable(search, largest, larger, False)[1]  # the CPU says so
    fits_too = outcome(probe_doc(150))
    assert verdicts.verdict_expandable(search, largest, fits_too, True)[0] == "fail"  # over-cautious
    no_run = outcome(probe_doc(120, False, "out_of_memory"))
    assert verdicts.verdict_expandable(search, no_run, larger, True)[0] == "fail"  # the answer did not run
    assert verdicts.verdict_expandable(outcome(search_doc(0)), None, None, True)[0] == "fail"
    cut = Outcome(124, "", "", 120.0, True)
    assert verdicts.verdict_expandable(search, largest, cut, True)[0] == "fail"


def test_cli_checkpointing_wants_a_clearly_lower_peak():
    off, on = outcome(probe_doc(8, peak=1400 << 20)), outcome(probe_doc(8, peak=700 << 20))
    status, detail, figures = verdicts.verdict_cli_checkpointing(off, on)
    assert status == "pass" and figures["ratio"] == pytest.approx(0.5), detail
    barely = outcome(probe_doc(8, peak=1300 << 20))  # 7 % lower: the activations were kept
    assert verdicts.verdict_cli_checkpointing(off, barely)[0] == "fail"
    failed = outcome(probe_doc(8, False, "error", peak=0))
    assert verdicts.verdict_cli_checkpointing(off, failed)[0] == "fail"
    refused = Outcome(2, "", "batchtune: --checkpointing: ...\n", 0.1)
    assert verdicts.verdict_cli_checkpointing(off, refused)[0] == "fail"


def lengths_job(**kw):
    doc = {"longest": 512, "samples": 2000, "mean_length": 101.0, "seen_lengths": [64, 128, 256, 512],
           "token_budget": 16384, "tokens_per_step": 16384,
           "length_buckets": [{"max_length": 128, "micro_batch_size": 128},
                              {"max_length": 512, "micro_batch_size": 32}],
           "max_batch_size": 33, "complete": True, "per_token_bytes": 90000, "fit_error": 0.03,
           "tune_seconds": 25.0, "steps_asked": 10, "steps": 10, "micro_batches": 14,
           "micro_batches_over_budget": 0, "losses": [8.3] * 10, "finite": True, "recoveries": [],
           "peak_allocated_bytes": 1 << 30, "memory_limit": "2GiB", "amp": "bf16"}
    return dict(doc, **kw)


def test_py_lengths_wants_a_budget_for_every_bucket_and_steps_without_out_of_memory():
    status, detail, figures = verdicts.verdict_py_lengths(job(lengths_job()))
    assert status == "pass" and figures["token_budget"] == 16384, detail
    over = lengths_job(length_buckets=[{"max_length": 512, "micro_batch_size": 40}])
    assert verdicts.verdict_py_lengths(job(over))[0] == "fail"
    short = lengths_job(length_buckets=[{"max_length": 256, "micro_batch_size": 64}])
    assert verdicts.verdict_py_lengths(job(short))[0] == "fail"  # the longest has no bucket
    one_length = lengths_job(seen_lengths=[512])
    assert verdicts.verdict_py_lengths(job(one_length))[0] == "fail"  # no length phase
    recovered = lengths_job(recoveries=["step 3: out of memory"])
    assert verdicts.verdict_py_lengths(job(recovered))[0] == "fail"
    assert verdicts.verdict_py_lengths(job(lengths_job(steps=4)))[0] == "fail"
    assert verdicts.verdict_py_lengths(job(lengths_job(token_budget=0)))[0] == "fail"


def compile_job(**kw):
    doc = {"backend": "inductor", "model": "causal LM 4x512, 256 tokens", "memory_limit": "2GiB", "amp": "bf16",
           "eager_max_batch_size": 60, "eager_complete": True, "eager_compile_seconds": None,
           "eager_seconds": 20.0, "max_batch_size": 66, "complete": True, "compile_seconds": 41.0,
           "recompiles": 0, "graphs": 2, "seconds": 70.0, "trials": [], "state_identical": True}
    return dict(doc, **kw)


def test_py_compile_wants_the_compile_apart_few_recompiles_and_the_eager_batch():
    status, detail, figures = verdicts.verdict_py_compile(job(compile_job()), True)
    assert status == "pass" and figures["ratio"] == pytest.approx(1.1), detail
    assert verdicts.verdict_py_compile(job(compile_job(max_batch_size=58)), True)[0] == "pass"  # within 5 %
    assert verdicts.verdict_py_compile(job(compile_job(max_batch_size=50)), True)[0] == "fail"
    assert verdicts.verdict_py_compile(job(compile_job(recompiles=5)), True)[0] == "fail"
    assert verdicts.verdict_py_compile(job(compile_job(compile_seconds=None)), True)[0] == "fail"
    assert verdicts.verdict_py_compile(job(compile_job(eager_compile_seconds=3.0)), True)[0] == "fail"
    assert verdicts.verdict_py_compile(job(compile_job(state_identical=False)), True)[0] == "fail"
    aot = compile_job(backend="aot_eager")
    assert verdicts.verdict_py_compile(job(aot), True)[0] == "fail"   # a GPU compiles with inductor
    assert verdicts.verdict_py_compile(job(aot), False)[0] == "pass"  # the CPU rehearsal does not


def checkpointing_job(kept="off", **kw):
    reason = (f"checkpointing fits 150 against 60 at 0.82x the samples/s ([0.78x, 0.86x], batch 48 against 48): "
              + ("slower beyond the measurements' spread; kept off" if kept == "off"
                 else "faster beyond the measurements' spread; kept on"))
    doc = {"model": "causal LM 4x512, 256 tokens", "memory_limit": "2GiB", "amp": "bf16", "blocks": 4,
           "checkpointing": kept, "checkpoint_modules": ["Block"] if kept == "on" else [],
           "in_plan_json": kept == "on", "reason": reason, "reasons_found": 1,
           "recomputing": 4 if kept == "on" else 0, "max_batch_size": 60, "chosen_batch_size": 48,
           "seconds": 55.0}
    return dict(doc, **kw)


def test_py_checkpointing_wants_its_decision_and_reason_to_agree_with_the_plan_and_model():
    for kept in ("off", "on"):
        status, detail, figures = verdicts.verdict_py_checkpointing(job(checkpointing_job(kept)))
        assert status == "pass" and figures["kept"] == kept and figures["fits_on"] == 150, detail
    left_on = checkpointing_job("off", recomputing=4)  # kept off but the model still recomputes
    assert verdicts.verdict_py_checkpointing(job(left_on))[0] == "fail"
    plan_off = checkpointing_job("on", checkpointing="off", in_plan_json=False)
    assert verdicts.verdict_py_checkpointing(job(plan_off))[0] == "fail"
    no_reason = checkpointing_job(reason=None, reasons_found=0)
    assert verdicts.verdict_py_checkpointing(job(no_reason))[0] == "fail"
    no_gain = checkpointing_job(reason="checkpointing fits 60 against 60: kept off")
    assert verdicts.verdict_py_checkpointing(job(no_gain))[0] == "fail"  # recomputing fitted no more


def test_the_new_rows_are_in_their_parts(tmp_path, monkeypatch):
    """The CLI's new rows run in part 1 (basic), the Python ones in part 2."""
    args = type("Args", (), dict(out=str(tmp_path), work=str(tmp_path / "w"), cli="/nonexistent/batchtune",
                                 mode="rehearse", deadline_at=time.time() + 600, python=sys.executable,
                                 smi="nvidia-smi"))
    run = checks.Checks(args)
    seen = []
    for name in ("train_adapt", "train_text", "expandable_segments", "cli_checkpointing"):
        monkeypatch.setattr(run, name, lambda *a, name=name: seen.append(name))
    for name in ("check", "no_context", "boundary", "tune_memory", "monitor_vs_smi", "step_scaling",
                 "clean_errors", "py_tune"):
        monkeypatch.setattr(run, name, lambda *a, **k: None)
    monkeypatch.setattr(run, "job_check", lambda name, *a: seen.append(name))
    run.run("basic")
    assert seen == ["train_adapt", "train_text", "expandable_segments", "cli_checkpointing"]
    seen.clear()
    run.run("python")
    assert seen[-3:] == ["py-lengths", "py-compile", "py-checkpointing"]
