"""The verdicts: each reads a command's outcome and returns (status, detail,
figures). Pure: tests/python/test_gpu_check.py feeds them made-up outputs."""
from __future__ import annotations

import json
import math
import statistics
from typing import Callable, Dict, Optional, Sequence, Tuple

from .rows import FAIL, PASS
from .running import Outcome

# The guide's claims (README, docs/manual.md).
UTILIZATION_TARGET = 85.0       # GPU-Util at the chosen batch, %
THROUGHPUT_GAIN_TARGET = 2.0    # chosen batch against batch 16: the guide says 2-3x
BF16_BATCH_GAIN_TARGET = 1.5    # largest bf16 batch against fp32: the guide says about twice

Verdict = Tuple[str, str, Dict]


def mib(b) -> str:
    return f"{b / 2**20:.0f} MiB"


def unreadable(o: Outcome, e: Exception) -> Verdict:
    return FAIL, f"exit {o.rc}; unreadable output ({type(e).__name__}: {e}); {o.err.strip()[-200:]}", {}


def guarded(fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
    def wrapper(o: Outcome, *args, **kwargs) -> Verdict:
        if o.timed_out:
            return FAIL, f"timed out after {o.seconds:.0f} s", {}
        try:
            return fn(o, *args, **kwargs)
        except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError) as e:
            return unreadable(o, e)
    wrapper.__name__ = fn.__name__
    return wrapper


@guarded
def verdict_env(o: Outcome, gpu: bool) -> Verdict:
    e = o.json()
    d = e["devices"][0] if e["devices"] else {}
    ok = o.rc == 0 and (not gpu or (e["cuda_available"] and e["device_count"] >= 1 and e["nvml_available"]))
    return (PASS if ok else FAIL,
            f'cuda_available {e["cuda_available"]}, {e["device_count"]} device(s) {d.get("name", "")}, '
            f'nvml {e["nvml_available"]}; {e.get("cuda_reason") or ""}'.strip(),
            {"cuda_available": e["cuda_available"], "device_count": e["device_count"],
             "device": d.get("name"), "total_bytes": d.get("total_bytes"),
             "free_bytes": d.get("free_bytes"), "nvml_available": e["nvml_available"]})


@guarded
def verdict_fits(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["fits"] and r["failure"] is None
    return (PASS if ok else FAIL,
            f'fits {r["fits"]}, peak {mib(r["peak_bytes"])} of {mib(r["usable_bytes"])} usable, '
            f'step {r["step_ms"]:.2f} ms, {r["samples_per_s"]:.0f} samples/s',
            {k: r[k] for k in ("batch_size", "fits", "peak_bytes", "usable_bytes", "step_ms", "samples_per_s")})


@guarded
def verdict_oom(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and not r["fits"] and r["failure"] == "out_of_memory"
    return (PASS if ok else FAIL, f'fits {r["fits"]}, failure {r["failure"]}: {(r["error"] or "")[:100]}',
            {"batch_size": r["batch_size"], "fits": r["fits"], "failure": r["failure"]})


@guarded
def verdict_next(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and not r["fits"] and r["failure"] in ("out_of_memory", "over_budget")
    return (PASS if ok else FAIL,
            f'batch {r["batch_size"]}: fits {r["fits"]}, failure {r["failure"]}, peak '
            f'{mib(r["peak_bytes"])} of {mib(r["usable_bytes"])}',
            {"batch_size": r["batch_size"], "fits": r["fits"], "failure": r["failure"],
             "peak_bytes": r["peak_bytes"]})


@guarded
def verdict_max(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["max_batch_size"] > 0 and r["complete"]
    return (PASS if ok else FAIL,
            f'largest fitting batch {r["max_batch_size"]} at amp {r["amp"]} ({r["search"]["trials"]} trials, '
            f'{r["search"]["seconds"]:.1f} s; {r["search"]["stop_reason"]})',
            {"max_batch_size": r["max_batch_size"], "amp": r["amp"], "trials": r["search"]["trials"],
             "usable_bytes": r["usable_bytes"]})


@guarded
def verdict_tune_memory(o: Outcome, limit_bytes: int, smi_used_mib: Sequence[float],
                        baseline_mib: Optional[float], gpu: bool) -> Verdict:
    """The device's used memory seen by nvidia-smi during a tune under a
    limit stays within it (what else was on the device before counted out),
    and every sweep row has its energy and utilization where a GPU measures
    them. A peak inside the budget is true by construction (the trials say
    what they measured); nvidia-smi is the outside witness."""
    r = o.json()
    sweep = r["sweep"]
    if not smi_used_mib or baseline_mib is None:
        return FAIL, f"exit {o.rc}; no nvidia-smi reading during the run", {"chosen_batch_size": r["chosen_batch_size"]}
    used = (max(smi_used_mib) - baseline_mib) * 2**20
    energy = [s for s in sweep if s.get("energy_j_per_sample") is not None]
    util = [s for s in sweep if s.get("utilization") is not None]
    ok = (o.rc == 0 and r["complete"] and sweep and r["chosen_batch_size"] > 0 and used <= limit_bytes
          and (not gpu or (len(energy) == len(sweep) and len(util) == len(sweep))))
    return (PASS if ok else FAIL,
            f'nvidia-smi: at most {mib(used)} used by the run against the limit {mib(limit_bytes)} '
            f'({len(smi_used_mib)} readings); chosen {r["chosen_batch_size"]} of max {r["max_batch_size"]}; '
            f'energy in {len(energy)}/{len(sweep)} rows, utilization in {len(util)}/{len(sweep)}',
            {"smi_max_used_bytes": used, "limit_bytes": limit_bytes, "smi_readings": len(smi_used_mib),
             "baseline_mib": baseline_mib, "chosen_batch_size": r["chosen_batch_size"],
             "max_batch_size": r["max_batch_size"], "rows_with_energy": len(energy),
             "rows_with_utilization": len(util), "rows": len(sweep)})


@guarded
def verdict_train(o: Outcome, amp: str, steps: int) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["complete"] and r["steps"] == steps and math.isfinite(r["final_loss"])
    detail = f'{r["steps"]} steps, loss {r["final_loss"]:.4f}, {r["samples_per_s"]:.0f} samples/s'
    figures = {"steps": r["steps"], "final_loss": r["final_loss"], "samples_per_s": r["samples_per_s"]}
    if amp == "fp16":
        scale, skipped = r.get("loss_scale"), r.get("skipped_steps", 0)
        ok = ok and scale is not None and scale >= 1 and skipped <= max(1, steps // 10)
        detail += f", loss scale {scale}, {skipped} skipped"
        figures.update(loss_scale=scale, skipped_steps=skipped)
    return PASS if ok else FAIL, detail, figures


@guarded
def verdict_recover(o: Outcome, start: int) -> Verdict:
    r = o.json()
    ok = (o.rc == 0 and r["complete"] and r["oom_recoveries"] >= 1 and r["micro_batch_size"] < start
          and math.isfinite(r["final_loss"]))
    return (PASS if ok else FAIL,
            f'{r["oom_recoveries"]} recoveries: micro-batch {start} -> {r["micro_batch_size"]} x '
            f'{r["accumulation_steps"]}, loss {r["final_loss"]:.4f}',
            {"oom_recoveries": r["oom_recoveries"], "micro_batch_size": r["micro_batch_size"]})


@guarded
def verdict_attention(o: Outcome, bound: int) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["fits"] and r["peak_bytes"] < bound
    return (PASS if ok else FAIL,
            f'fits {r["fits"]}, peak {mib(r["peak_bytes"])} (one materialised score matrix: {mib(bound)}), '
            f'step {r["step_ms"]:.1f} ms; {(r["error"] or "")[:80]}',
            {"fits": r["fits"], "peak_bytes": r["peak_bytes"], "score_matrix_bytes": bound})


def verdict_clean_error(o: Outcome, expected: str) -> Verdict:
    if o.timed_out:
        return FAIL, f"timed out after {o.seconds:.0f} s", {}
    lines = [line for line in o.err.strip().splitlines() if line.strip()]
    ok = o.rc == 2 and len(lines) == 1 and expected in lines[0]
    return PASS if ok else FAIL, f'exit {o.rc}: {lines[0][:160] if lines else "(nothing on stderr)"}', {"exit": o.rc}


@guarded
def verdict_hidden_env(o: Outcome) -> Verdict:
    e = o.json()
    ok = o.rc == 0 and not e["cuda_available"] and bool(e["cuda_reason"])
    return PASS if ok else FAIL, f'exit {o.rc}, cuda_available {e["cuda_available"]}: {e["cuda_reason"]}', {}


def verdict_step_scaling(small: Dict, big: Dict, ratio_bounds=(1.2, 4.8)) -> Verdict:
    """4x the samples take more time, and at most 4.8x (linear plus 20 %):
    a ratio near 1 means the timer saw kernel launches, not finished work."""
    r = big["step_ms"] / small["step_ms"]
    lo, hi = ratio_bounds
    return (PASS if lo <= r <= hi else FAIL,
            f'step {small["step_ms"]:.2f} ms at {small["batch_size"]}, {big["step_ms"]:.2f} ms at '
            f'{big["batch_size"]}: ratio {r:.2f} (expected {lo} to {hi})', {"ratio": r})


def verdict_monitor_vs_smi(monitor_lines: Sequence[str], smi_csv: str, device: str, gpu: bool) -> Verdict:
    """`monitor` and nvidia-smi over the same seconds: medians within 15
    utilization points and 5 % or 512 MiB of memory (on a GPU)."""
    rows = [json.loads(line) for line in monitor_lines if line.strip()][1:]
    rows = [r for r in rows if r["device"] == device]
    smi = [line.split(",") for line in smi_csv.splitlines() if "," in line]
    if len(rows) < 3 or len(smi) < 3:
        return FAIL, f"too few samples: {len(rows)} from monitor, {len(smi)} from nvidia-smi", {}
    u_bt = statistics.median(r["utilization_percent"] for r in rows if r["utilization_percent"] is not None)
    u_smi = statistics.median(float(a) for a, _ in smi)
    m_smi = statistics.median(float(b) for _, b in smi)
    memories = [r["memory_used_bytes"] for r in rows if r["memory_used_bytes"] is not None]
    m_bt = statistics.median(memories) / 2**20 if memories else None
    figures = {"utilization_monitor": u_bt, "utilization_smi": u_smi, "memory_monitor_mib": m_bt,
               "memory_smi_mib": m_smi, "samples": [len(rows), len(smi)]}
    if gpu:
        ok = (m_bt is not None and abs(u_bt - u_smi) <= 15 and abs(m_bt - m_smi) <= max(0.05 * m_smi, 512)
              and u_smi > 0)
    else:  # the CPU's utilization against a stand-in: parsed, not compared
        ok = True
    return (PASS if ok else FAIL,
            f"utilization {u_bt:.0f} % vs nvidia-smi {u_smi:.0f} %, memory "
            f"{'n/a' if m_bt is None else f'{m_bt:.0f}'} vs {m_smi:.0f} MiB ({len(rows)} and {len(smi)} samples)",
            figures)


@guarded
def verdict_claim_utilization(o: Outcome, gpu: bool) -> Verdict:
    """The guide: GPU-Util at the chosen batch, read over its timed steps
    only, at 85 % or more."""
    r = o.json()
    chosen = r["chosen_batch_size"]
    row = next((s for s in r["sweep"] if s["batch_size"] == chosen), None)
    util = row.get("utilization") if row else None
    figures = {"chosen_batch_size": chosen, "max_batch_size": r["max_batch_size"], "amp": r["amp"],
               "utilization": util, "target": UTILIZATION_TARGET,
               "curve": [[s["batch_size"], s["samples_per_s"], s.get("utilization")] for s in r["sweep"]]}
    if o.rc != 0 or row is None or util is None:
        return FAIL, f"exit {o.rc}; no utilization at the chosen batch {chosen}: {r.get('utilization_note')}", figures
    ok = util >= UTILIZATION_TARGET if gpu else util >= 0
    return (PASS if ok else FAIL,
            f'utilization {util:.0f} % at the chosen batch {chosen} (target {UTILIZATION_TARGET:.0f} %'
            f'{"" if gpu else ", GPU only"}); max batch {r["max_batch_size"]}, amp {r["amp"]}', figures)


def verdict_claim_throughput(tune: Dict, base: Dict, gpu: bool) -> Verdict:
    """The guide: the chosen batch runs 2-3x the samples/s of batch 16."""
    chosen = tune["chosen_batch_size"]
    row = next((s for s in tune["sweep"] if s["batch_size"] == chosen), None)
    if row is None or not base.get("fits") or not base.get("samples_per_s"):
        return FAIL, f"no throughput at the chosen batch {chosen} or at batch {base.get('batch_size')}", {}
    gain = row["samples_per_s"] / base["samples_per_s"]
    ok = gain >= THROUGHPUT_GAIN_TARGET if gpu else gain > 0
    return (PASS if ok else FAIL,
            f'{row["samples_per_s"]:.0f} samples/s at the chosen batch {chosen} against '
            f'{base["samples_per_s"]:.0f} at batch {base["batch_size"]}: {gain:.2f}x '
            f'(the guide: {THROUGHPUT_GAIN_TARGET:.0f}-3x{"" if gpu else ", GPU only"})',
            {"chosen_batch_size": chosen, "chosen_samples_per_s": row["samples_per_s"],
             "base_batch_size": base["batch_size"], "base_samples_per_s": base["samples_per_s"], "gain": gain})


def verdict_claim_bf16_batch(model: str, fp32: Dict, bf16: Dict, gpu: bool) -> Verdict:
    """The guide: under bf16 about twice the batch fits."""
    a, b = fp32["max_batch_size"], bf16["max_batch_size"]
    if a <= 0 or b <= 0:
        return FAIL, f"{model}: no largest batch (fp32 {a}, bf16 {b})", {"fp32": a, "bf16": b}
    ratio = b / a
    ok = ratio >= BF16_BATCH_GAIN_TARGET if gpu else ratio > 0
    return (PASS if ok else FAIL,
            f"{model}: largest batch {a} in fp32, {b} in bf16: {ratio:.2f}x (the guide: about 2x"
            f"{'' if gpu else ', GPU only'})",
            {"fp32": a, "bf16": b, "ratio": ratio, "target": BF16_BATCH_GAIN_TARGET})
