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


def sweep_row(batch, samples_per_s, utilization, energy=1.0):
    return {"batch_size": batch, "samples_per_s": samples_per_s, "utilization": utilization,
            "energy_j_per_sample": energy, "peak_bytes": batch << 20}


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
